-- Setting the token column is refused.
-- input:
UPDATE accounts SET fence_token = 0 WHERE id = 1
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: UPDATE of accounts sets the token column fence_token, which only the proxy sets
