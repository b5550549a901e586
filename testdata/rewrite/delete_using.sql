-- DELETE ... USING with an alias and RETURNING.
-- input:
DELETE FROM accounts a USING closed c WHERE c.id = a.id RETURNING a.id
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) DELETE FROM accounts a USING closed c WHERE c.id = a.id AND CASE WHEN c.id = a.id THEN CASE WHEN COALESCE(a.fence_token, 0) OPERATOR(pg_catalog.<=) {{t}} THEN true ELSE pg_catalog.concat('fenceproxy|55F01|', a.fence_token, '|', {{t}}, '|accounts|.')::bigint IS NULL END ELSE false END AND {{t}} IS NOT NULL RETURNING a.id
