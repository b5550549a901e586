-- A conjunct calling a function with side effects (nextval) is evaluated once: only inside the CASE.
-- input:
UPDATE accounts SET balance = 0 WHERE id = $1 AND nextval('s') % 2 = 1
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token) UPDATE accounts SET balance = 0, fence_token = {{t}} WHERE id = $1 AND CASE WHEN id = $1 AND (nextval('s') % 2) = 1 THEN CASE WHEN COALESCE(accounts.fence_token, 0) OPERATOR(pg_catalog.<=) {{t}} THEN true ELSE pg_catalog.concat('fenceproxy|55F01|', accounts.fence_token, '|', {{t}}, '|accounts|.')::bigint IS NULL END ELSE false END AND {{t}} IS NOT NULL
