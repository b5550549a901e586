-- A write hidden in an assignment's expression (a CTE) is found.
-- input:
DO $$DECLARE n int; BEGIN n := (WITH u AS (UPDATE accounts SET balance = 0 RETURNING 1) SELECT count(*) FROM u); END$$
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: a DO block that writes accounts cannot be fenced; run its statements through the proxy as plain SQL
