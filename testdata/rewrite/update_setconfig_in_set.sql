-- Issue 11 class 3: a set_config in the SET list runs after the statement's token was read (one-time filter).
-- input:
UPDATE accounts SET balance = balance + length(set_config('fence.token', '1', false)) - 1 WHERE id = 1
-- output:
-- action: rewrite
-- tables: accounts
-- token: 1
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) UPDATE accounts SET balance = (balance + length(set_config('fence.token', '1', false))) - 1, fence_token = (SELECT CASE WHEN COALESCE(accounts.fence_token, 0) OPERATOR(pg_catalog.<=) fenceproxy_stmt.token THEN fenceproxy_stmt.token ELSE pg_catalog.concat('fenceproxy|55F01|', accounts.fence_token, '|', fenceproxy_stmt.token, '|accounts|.')::bigint END FROM fenceproxy_stmt) WHERE id = 1 AND {{t}} IS NOT NULL
