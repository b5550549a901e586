-- INSERT ... set operation naming C: refused (leave the column out).
-- input:
INSERT INTO accounts (id, fence_token) SELECT 1, 2 UNION ALL SELECT 3, 4
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: INSERT into accounts names the token column fence_token and takes its rows from a set operation; leave the column out
