-- SET C = $n (override): $n stays in the statement, cast to int8 as the assignment to a bigint column would, so
-- Describe reports the same type.
-- input:
UPDATE accounts SET balance = $1, fence_token = $2 WHERE id = $3
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) UPDATE accounts SET balance = $1, fence_token = CASE WHEN false THEN $2::bigint ELSE (SELECT CASE WHEN COALESCE(accounts.fence_token, 0) OPERATOR(pg_catalog.<=) fenceproxy_stmt.token THEN fenceproxy_stmt.token ELSE pg_catalog.concat('fenceproxy|55F01|', accounts.fence_token, '|', fenceproxy_stmt.token, '|accounts|.')::bigint END FROM fenceproxy_stmt) END WHERE id = $3 AND {{t}} IS NOT NULL
