-- Several statements: each write fenced, all deparsed.
-- input:
BEGIN; UPDATE accounts SET balance = balance - 1 WHERE id = 1; INSERT INTO accounts (id, balance) VALUES (2, 1); SELECT 1; COMMIT
-- output:
-- action: rewrite
-- tables: accounts
BEGIN; WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) UPDATE accounts SET balance = balance - 1, fence_token = (SELECT CASE WHEN COALESCE(accounts.fence_token, 0) OPERATOR(pg_catalog.<=) fenceproxy_stmt.token THEN fenceproxy_stmt.token ELSE pg_catalog.concat('fenceproxy|55F01|', accounts.fence_token, '|', fenceproxy_stmt.token, '|accounts|.')::bigint END FROM fenceproxy_stmt) WHERE id = 1 AND {{t}} IS NOT NULL; WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) INSERT INTO accounts (id, balance, fence_token) VALUES (2, 1, {{t}}); SELECT 1; COMMIT
