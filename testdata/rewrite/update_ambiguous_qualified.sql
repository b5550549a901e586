-- b.dup, qualified, uses its own token column.
-- input:
UPDATE b.dup SET x = 1 WHERE id = 1
-- output:
-- action: rewrite
-- tables: b.dup
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k b.dup}} AS token) UPDATE b.dup SET x = 1, t2 = {{t}} WHERE id = 1 AND CASE WHEN id = 1 THEN CASE WHEN COALESCE(b.dup.t2, 0) OPERATOR(pg_catalog.<=) {{t}} THEN true ELSE pg_catalog.concat('fenceproxy|55F01|', b.dup.t2, '|', {{t}}, '|b.dup|.')::bigint IS NULL END ELSE false END AND {{t}} IS NOT NULL
