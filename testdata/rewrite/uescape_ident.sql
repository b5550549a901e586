-- U&"..." UESCAPE decodes to the protected name.
-- input:
UPDATE U&"!0061ccounts" UESCAPE '!' SET balance = 0
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token) UPDATE accounts SET balance = 0, fence_token = {{t}} WHERE CASE WHEN COALESCE(accounts.fence_token, 0) OPERATOR(pg_catalog.<=) {{t}} THEN true ELSE pg_catalog.concat('fenceproxy|55F01|', accounts.fence_token, '|', {{t}}, '|accounts|.')::bigint IS NULL END AND {{t}} IS NOT NULL
