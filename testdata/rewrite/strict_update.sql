-- token_column_writes: refuse: a write that does not name C is fenced as usual.
-- input:
UPDATE strict SET balance = 1 WHERE id = 1
-- output:
-- action: rewrite
-- tables: strict
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k strict}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) UPDATE strict SET balance = 1, fence_token = (SELECT CASE WHEN COALESCE(strict.fence_token, 0) OPERATOR(pg_catalog.<=) fenceproxy_stmt.token THEN fenceproxy_stmt.token ELSE pg_catalog.concat('fenceproxy|55F01|', strict.fence_token, '|', fenceproxy_stmt.token, '|strict|.')::bigint END FROM fenceproxy_stmt) WHERE id = 1 AND {{t}} IS NOT NULL
