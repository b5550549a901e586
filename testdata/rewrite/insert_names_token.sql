-- Naming the token column is refused.
-- input:
INSERT INTO accounts (id, fence_token) VALUES (1, 5)
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: INSERT into accounts names the token column fence_token, which only the proxy sets
