-- token_column_writes: refuse: C in an INSERT column list is refused.
-- input:
INSERT INTO strict (id, fence_token) VALUES ($1, $2)
-- output:
-- action: refuse
-- code: 55F04
-- table: strict
-- message: unfenceable write: INSERT into strict names the token column fence_token, which only the proxy sets
