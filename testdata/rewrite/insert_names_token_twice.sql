-- C named twice: refused.
-- input:
INSERT INTO accounts (fence_token, id, fence_token) VALUES (1, 2, 3)
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: INSERT into accounts names the token column fence_token more than once or in part
