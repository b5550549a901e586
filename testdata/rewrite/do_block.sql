-- A DO block whose static SQL writes a protected table is refused: its decoded body is parsed as PL/pgSQL.
-- input:
DO $$ BEGIN UPDATE accounts SET balance = 0; END $$
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: a DO block that writes accounts cannot be fenced; run its statements through the proxy as plain SQL
