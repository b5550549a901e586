-- A DO body in a tagged dollar quote holding $$ itself.
-- input:
DO $body$BEGIN PERFORM $$x$$; INSERT INTO accounts (id) VALUES (1); END$body$
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: a DO block that writes accounts cannot be fenced; run its statements through the proxy as plain SQL
