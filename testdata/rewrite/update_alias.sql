-- An alias is used for the token column reference; RETURNING is kept.
-- input:
UPDATE accounts AS a SET balance = a.balance - 10 WHERE a.id = 7 RETURNING a.balance
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) UPDATE accounts a SET balance = a.balance - 10, fence_token = (SELECT CASE WHEN COALESCE(a.fence_token, 0) OPERATOR(pg_catalog.<=) fenceproxy_stmt.token THEN fenceproxy_stmt.token ELSE pg_catalog.concat('fenceproxy|55F01|', a.fence_token, '|', fenceproxy_stmt.token, '|accounts|.')::bigint END FROM fenceproxy_stmt) WHERE a.id = 7 AND {{t}} IS NOT NULL RETURNING a.balance
