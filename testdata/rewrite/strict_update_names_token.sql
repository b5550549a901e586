-- token_column_writes: refuse keeps the 55F04 refusal for SET C.
-- input:
UPDATE strict SET fence_token = 0 WHERE id = 1
-- output:
-- action: refuse
-- code: 55F04
-- table: strict
-- message: unfenceable write: UPDATE of strict sets the token column fence_token, which only the proxy sets
