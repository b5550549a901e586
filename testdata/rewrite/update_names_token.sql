-- SET C = ... (override): C is written as the statement's token whatever the statement supplies; the row check is
-- unchanged (the ELSE arm).
-- input:
UPDATE accounts SET fence_token = 0 WHERE id = 1
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) UPDATE accounts SET fence_token = CASE WHEN false THEN 0::bigint ELSE (SELECT CASE WHEN COALESCE(accounts.fence_token, 0) OPERATOR(pg_catalog.<=) fenceproxy_stmt.token THEN fenceproxy_stmt.token ELSE pg_catalog.concat('fenceproxy|55F01|', accounts.fence_token, '|', fenceproxy_stmt.token, '|accounts|.')::bigint END FROM fenceproxy_stmt) END WHERE id = 1 AND {{t}} IS NOT NULL
