-- UPDATE ... FROM: the check refers to the target's alias.
-- input:
UPDATE accounts a SET balance = a.balance + t.amount FROM transfers t WHERE t.account_id = a.id AND t.id = $1
-- output:
-- action: rewrite
-- tables: accounts
UPDATE accounts a SET balance = a.balance + t.amount, fence_token = {{light accounts}} FROM transfers t WHERE t.account_id = a.id AND t.id = $1 AND CASE WHEN t.account_id = a.id AND t.id = $1 THEN CASE WHEN COALESCE(a.fence_token, 0) <= {{light accounts}} THEN true ELSE (((('fenceproxy|55F01|' || a.fence_token::text) || '|') || pg_catalog.ltrim(pg_catalog.current_setting('fence.token'), '0')) || '|accounts|.')::int8 IS NULL END ELSE false END AND {{k accounts}} IS NOT NULL
