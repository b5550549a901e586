-- UPDATE ... FROM: the check refers to the target's alias.
-- input:
UPDATE accounts a SET balance = a.balance + t.amount FROM transfers t WHERE t.account_id = a.id AND t.id = $1
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token) UPDATE accounts a SET balance = a.balance + t.amount, fence_token = {{t}} FROM transfers t WHERE t.account_id = a.id AND t.id = $1 AND CASE WHEN t.account_id = a.id AND t.id = $1 THEN CASE WHEN COALESCE(a.fence_token, 0) OPERATOR(pg_catalog.<=) {{t}} THEN true ELSE pg_catalog.concat('fenceproxy|55F01|', a.fence_token, '|', {{t}}, '|accounts|.')::bigint IS NULL END ELSE false END AND {{t}} IS NOT NULL
