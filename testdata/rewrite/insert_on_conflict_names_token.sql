-- DO UPDATE SET C is refused.
-- input:
INSERT INTO accounts (id) VALUES (1) ON CONFLICT (id) DO UPDATE SET fence_token = excluded.fence_token
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: INSERT into accounts ... ON CONFLICT DO UPDATE sets the token column fence_token, which only the proxy sets
