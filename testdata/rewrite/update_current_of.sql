-- WHERE CURRENT OF cannot carry the check.
-- input:
UPDATE accounts SET balance = 1 WHERE CURRENT OF c
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: UPDATE of accounts with WHERE CURRENT OF cannot be fenced; use a key in the WHERE clause
