-- DELETE without WHERE.
-- input:
DELETE FROM accounts
-- output:
-- action: rewrite
-- tables: accounts
DELETE FROM accounts WHERE CASE WHEN COALESCE(accounts.fence_token, 0) <= {{light accounts}} THEN true ELSE (((('fenceproxy|55F01|' || accounts.fence_token::text) || '|') || pg_catalog.ltrim(pg_catalog.current_setting('fence.token'), '0')) || '|accounts|.')::int8 IS NULL END AND {{k accounts}} IS NOT NULL
