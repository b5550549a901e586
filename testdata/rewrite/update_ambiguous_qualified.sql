-- b.dup, qualified, uses its own token column.
-- input:
UPDATE b.dup SET x = 1 WHERE id = 1
-- output:
-- action: rewrite
-- tables: b.dup
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k b.dup}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) UPDATE b.dup SET x = 1, t2 = (SELECT CASE WHEN COALESCE(b.dup.t2, 0) OPERATOR(pg_catalog.<=) fenceproxy_stmt.token THEN fenceproxy_stmt.token ELSE pg_catalog.concat('fenceproxy|55F01|', b.dup.t2, '|', fenceproxy_stmt.token, '|b.dup|.')::bigint END FROM fenceproxy_stmt) WHERE id = 1 AND {{t}} IS NOT NULL
