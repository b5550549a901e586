-- U&"..." UESCAPE decodes to the protected name.
-- input:
UPDATE U&"!0061ccounts" UESCAPE '!' SET balance = 0
-- output:
-- action: rewrite
-- tables: accounts
UPDATE accounts SET balance = 0, fence_token = {{light accounts}} WHERE CASE WHEN COALESCE(accounts.fence_token, 0) <= {{light accounts}} THEN true ELSE (((('fenceproxy|55F01|' || accounts.fence_token::text) || '|') || pg_catalog.ltrim(pg_catalog.current_setting('fence.token'), '0')) || '|accounts|.')::int8 IS NULL END AND {{k accounts}} IS NOT NULL
