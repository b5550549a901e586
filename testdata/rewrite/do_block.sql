-- A DO block that names a protected table is refused: its body is not analysed.
-- input:
DO $$ BEGIN UPDATE accounts SET balance = 0; END $$
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: a DO block that names accounts cannot be fenced; run its statements through the proxy as plain SQL
