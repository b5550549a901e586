-- A quoted identifier is the table however it is quoted.
-- input:
UPDATE "accounts" SET balance = 0; DELETE FROM U&"acc\006Funts" WHERE id = 2
-- output:
-- action: rewrite
-- tables: accounts
UPDATE accounts SET balance = 0, fence_token = {{light accounts}} WHERE CASE WHEN COALESCE(accounts.fence_token, 0) <= {{light accounts}} THEN true ELSE (((('fenceproxy|55F01|' || accounts.fence_token::text) || '|') || pg_catalog.ltrim(pg_catalog.current_setting('fence.token'), '0')) || '|accounts|.')::int8 IS NULL END AND {{k accounts}} IS NOT NULL; DELETE FROM accounts WHERE id = 2 AND CASE WHEN id = 2 THEN CASE WHEN COALESCE(accounts.fence_token, 0) <= {{light accounts}} THEN true ELSE (((('fenceproxy|55F01|' || accounts.fence_token::text) || '|') || pg_catalog.ltrim(pg_catalog.current_setting('fence.token'), '0')) || '|accounts|.')::int8 IS NULL END ELSE false END AND {{k accounts}} IS NOT NULL
