-- Audit is configured with a capital: only the quoted name matches.
-- input:
UPDATE "Audit" SET note = 'x' WHERE id = 1
-- output:
-- action: rewrite
-- tables: Audit
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k Audit}} AS token) UPDATE "Audit" SET note = 'x', fence_token = {{t}} WHERE id = 1 AND CASE WHEN id = 1 THEN CASE WHEN COALESCE("Audit".fence_token, 0) OPERATOR(pg_catalog.<=) {{t}} THEN true ELSE pg_catalog.concat('fenceproxy|55F01|', "Audit".fence_token, '|', {{t}}, '|Audit|.')::bigint IS NULL END ELSE false END AND {{t}} IS NOT NULL
