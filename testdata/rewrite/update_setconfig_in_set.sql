-- Issue 11 class 3: a set_config in the SET list runs after the statement's token was read (one-time filter).
-- input:
UPDATE accounts SET balance = balance + length(set_config('fence.token', '1', false)) - 1 WHERE id = 1
-- output:
-- action: rewrite
-- tables: accounts
-- token: 1
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token) UPDATE accounts SET balance = (balance + length(set_config('fence.token', '1', false))) - 1, fence_token = {{t}} WHERE id = 1 AND CASE WHEN id = 1 THEN CASE WHEN COALESCE(accounts.fence_token, 0) OPERATOR(pg_catalog.<=) {{t}} THEN true ELSE pg_catalog.concat('fenceproxy|55F01|', accounts.fence_token, '|', {{t}}, '|accounts|.')::bigint IS NULL END ELSE false END AND {{t}} IS NOT NULL
