-- UPDATE ... FROM: the check (in the SET list) refers to the target's alias.
-- input:
UPDATE accounts a SET balance = a.balance + t.amount FROM transfers t WHERE t.account_id = a.id AND t.id = $1
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) UPDATE accounts a SET balance = a.balance + t.amount, fence_token = (SELECT CASE WHEN COALESCE(a.fence_token, 0) OPERATOR(pg_catalog.<=) fenceproxy_stmt.token THEN fenceproxy_stmt.token ELSE pg_catalog.concat('fenceproxy|55F01|', a.fence_token, '|', fenceproxy_stmt.token, '|accounts|.')::bigint END FROM fenceproxy_stmt) FROM transfers t WHERE (t.account_id = a.id AND t.id = $1) AND {{t}} IS NOT NULL
