-- A DO block inside a DO block.
-- input:
DO $a$BEGIN EXECUTE $$x$$; DO $b$BEGIN UPDATE accounts SET balance = 0; END$b$; END$a$
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: a DO block that holds a statement the proxy refuses (unfenceable write: a DO block that writes accounts cannot be fenced; run its statements through the proxy as plain SQL) cannot be fenced; run its statements through the proxy as plain SQL
