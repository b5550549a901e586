-- An alias is used for the token column reference; RETURNING is kept.
-- input:
UPDATE accounts AS a SET balance = a.balance - 10 WHERE a.id = 7 RETURNING a.balance
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token) UPDATE accounts a SET balance = a.balance - 10, fence_token = {{t}} WHERE a.id = 7 AND CASE WHEN a.id = 7 THEN CASE WHEN COALESCE(a.fence_token, 0) OPERATOR(pg_catalog.<=) {{t}} THEN true ELSE pg_catalog.concat('fenceproxy|55F01|', a.fence_token, '|', {{t}}, '|accounts|.')::bigint IS NULL END ELSE false END AND {{t}} IS NOT NULL RETURNING a.balance
