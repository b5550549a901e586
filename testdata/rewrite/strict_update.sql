-- token_column_writes: refuse: a write that does not name C is fenced as usual.
-- input:
UPDATE strict SET balance = 1 WHERE id = 1
-- output:
-- action: rewrite
-- tables: strict
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k strict}} AS token) UPDATE strict SET balance = 1, fence_token = {{t}} WHERE id = 1 AND CASE WHEN id = 1 THEN CASE WHEN COALESCE(strict.fence_token, 0) OPERATOR(pg_catalog.<=) {{t}} THEN true ELSE pg_catalog.concat('fenceproxy|55F01|', strict.fence_token, '|', {{t}}, '|strict|.')::bigint IS NULL END ELSE false END AND {{t}} IS NOT NULL
