-- A multi-column SET without the token column.
-- input:
UPDATE accounts SET (balance, note) = (1, 'x') WHERE id = 1
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) UPDATE accounts SET (balance, note) = (1, 'x'), fence_token = (SELECT CASE WHEN COALESCE(accounts.fence_token, 0) OPERATOR(pg_catalog.<=) fenceproxy_stmt.token THEN fenceproxy_stmt.token ELSE pg_catalog.concat('fenceproxy|55F01|', accounts.fence_token, '|', fenceproxy_stmt.token, '|accounts|.')::bigint END FROM fenceproxy_stmt) WHERE id = 1 AND {{t}} IS NOT NULL
