-- An alias is used for the token column reference; RETURNING is kept.
-- input:
UPDATE accounts AS a SET balance = a.balance - 10 WHERE a.id = 7 RETURNING a.balance
-- output:
-- action: rewrite
-- tables: accounts
UPDATE accounts a SET balance = a.balance - 10, fence_token = {{light accounts}} WHERE a.id = 7 AND CASE WHEN a.id = 7 THEN CASE WHEN COALESCE(a.fence_token, 0) <= {{light accounts}} THEN true ELSE (((('fenceproxy|55F01|' || a.fence_token::text) || '|') || pg_catalog.ltrim(pg_catalog.current_setting('fence.token'), '0')) || '|accounts|.')::int8 IS NULL END ELSE false END AND {{k accounts}} IS NOT NULL RETURNING a.balance
