-- SET C = $n (override): $n stays in the statement, cast to int8 as the assignment to a bigint column would, so
-- Describe reports the same type.
-- input:
UPDATE accounts SET balance = $1, fence_token = $2 WHERE id = $3
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token) UPDATE accounts SET balance = $1, fence_token = CASE WHEN false THEN $2::bigint ELSE {{t}} END WHERE id = $3 AND CASE WHEN id = $3 THEN CASE WHEN COALESCE(accounts.fence_token, 0) OPERATOR(pg_catalog.<=) {{t}} THEN true ELSE pg_catalog.concat('fenceproxy|55F01|', accounts.fence_token, '|', {{t}}, '|accounts|.')::bigint IS NULL END ELSE false END AND {{t}} IS NOT NULL
