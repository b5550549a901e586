-- A DO body naming the table with a U& identifier is decoded.
-- input:
DO $$BEGIN UPDATE U&"\0061ccounts" SET balance = 0; END$$
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: a DO block that writes accounts cannot be fenced; run its statements through the proxy as plain SQL
