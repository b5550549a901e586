-- EXPLAIN with options of a DELETE.
-- input:
EXPLAIN (COSTS OFF, FORMAT JSON) DELETE FROM accounts WHERE id = 1
-- output:
-- action: rewrite
-- tables: accounts
EXPLAIN (COSTS OFF, FORMAT "json") WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) DELETE FROM accounts WHERE id = 1 AND CASE WHEN id = 1 THEN (SELECT CASE WHEN COALESCE(accounts.fence_token, 0) OPERATOR(pg_catalog.<=) fenceproxy_stmt.token THEN fenceproxy_stmt.token ELSE pg_catalog.concat('fenceproxy|55F01|', accounts.fence_token, '|', fenceproxy_stmt.token, '|accounts|.')::bigint END FROM fenceproxy_stmt) IS NOT NULL ELSE false END AND {{t}} IS NOT NULL
