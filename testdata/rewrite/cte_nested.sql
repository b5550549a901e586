-- A write in a CTE of a CTE (PostgreSQL rejects it; it is fenced anyway).
-- input:
WITH a AS (WITH b AS (UPDATE accounts SET balance = 1 WHERE id = 1 RETURNING id) SELECT * FROM b) SELECT * FROM a
-- output:
-- action: rewrite
-- tables: accounts
WITH a AS (WITH b AS (WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token) UPDATE accounts SET balance = 1, fence_token = {{t}} WHERE id = 1 AND CASE WHEN id = 1 THEN CASE WHEN COALESCE(accounts.fence_token, 0) OPERATOR(pg_catalog.<=) {{t}} THEN true ELSE pg_catalog.concat('fenceproxy|55F01|', accounts.fence_token, '|', {{t}}, '|accounts|.')::bigint IS NULL END ELSE false END AND {{t}} IS NOT NULL RETURNING id) SELECT * FROM b) SELECT * FROM a
