-- WHERE CURRENT OF is refused.
-- input:
DELETE FROM accounts WHERE CURRENT OF c
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: DELETE from accounts with WHERE CURRENT OF cannot be fenced; use a key in the WHERE clause
