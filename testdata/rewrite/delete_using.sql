-- DELETE ... USING with an alias and RETURNING.
-- input:
DELETE FROM accounts a USING closed c WHERE c.id = a.id RETURNING a.id
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) DELETE FROM accounts a USING closed c WHERE c.id = a.id AND CASE WHEN c.id = a.id THEN (SELECT CASE WHEN COALESCE(a.fence_token, 0) OPERATOR(pg_catalog.<=) fenceproxy_stmt.token THEN fenceproxy_stmt.token ELSE pg_catalog.concat('fenceproxy|55F01|', a.fence_token, '|', fenceproxy_stmt.token, '|accounts|.')::bigint END FROM fenceproxy_stmt) IS NOT NULL ELSE false END AND {{t}} IS NOT NULL RETURNING a.id
