-- The statement-token CTE's name is reserved: a client CTE of that name could shadow it.
-- input:
INSERT INTO accounts (id) WITH fenceproxy_stmt AS (SELECT 1 AS token) SELECT token FROM fenceproxy_stmt
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: the name fenceproxy_stmt is reserved for the fence; rename the WITH query
