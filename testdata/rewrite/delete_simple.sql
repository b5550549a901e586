-- DELETE gets the same WHERE treatment.
-- input:
DELETE FROM accounts WHERE id = $1
-- output:
-- action: rewrite
-- tables: accounts
DELETE FROM accounts WHERE id = $1 AND CASE WHEN id = $1 THEN CASE WHEN COALESCE(accounts.fence_token, 0) <= {{light accounts}} THEN true ELSE (((('fenceproxy|55F01|' || accounts.fence_token::text) || '|') || pg_catalog.ltrim(pg_catalog.current_setting('fence.token'), '0')) || '|accounts|.')::int8 IS NULL END ELSE false END AND {{k accounts}} IS NOT NULL
