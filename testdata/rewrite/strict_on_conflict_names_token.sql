-- token_column_writes: refuse: DO UPDATE SET C is refused.
-- input:
INSERT INTO strict (id) VALUES (1) ON CONFLICT (id) DO UPDATE SET fence_token = excluded.fence_token
-- output:
-- action: refuse
-- code: 55F04
-- table: strict
-- message: unfenceable write: INSERT into strict ... ON CONFLICT DO UPDATE sets the token column fence_token, which only the proxy sets
