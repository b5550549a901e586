-- Audit is configured with a capital: only the quoted name matches.
-- input:
UPDATE "Audit" SET note = 'x' WHERE id = 1
-- output:
-- action: rewrite
-- tables: Audit
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k Audit}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) UPDATE "Audit" SET note = 'x', fence_token = (SELECT CASE WHEN COALESCE("Audit".fence_token, 0) OPERATOR(pg_catalog.<=) fenceproxy_stmt.token THEN fenceproxy_stmt.token ELSE pg_catalog.concat('fenceproxy|55F01|', "Audit".fence_token, '|', fenceproxy_stmt.token, '|Audit|.')::bigint END FROM fenceproxy_stmt) WHERE id = 1 AND {{t}} IS NOT NULL
