-- DELETE without WHERE.
-- input:
DELETE FROM accounts
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) DELETE FROM accounts WHERE CASE WHEN COALESCE(accounts.fence_token, 0) OPERATOR(pg_catalog.<=) {{t}} THEN true ELSE pg_catalog.concat('fenceproxy|55F01|', accounts.fence_token, '|', {{t}}, '|accounts|.')::bigint IS NULL END AND {{t}} IS NOT NULL
