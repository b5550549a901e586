-- DELETE ... USING with an alias and RETURNING.
-- input:
DELETE FROM accounts a USING closed c WHERE c.id = a.id RETURNING a.id
-- output:
-- action: rewrite
-- tables: accounts
DELETE FROM accounts a USING closed c WHERE c.id = a.id AND CASE WHEN c.id = a.id THEN CASE WHEN COALESCE(a.fence_token, 0) <= {{light accounts}} THEN true ELSE (((('fenceproxy|55F01|' || a.fence_token::text) || '|') || pg_catalog.ltrim(pg_catalog.current_setting('fence.token'), '0')) || '|accounts|.')::int8 IS NULL END ELSE false END AND {{k accounts}} IS NOT NULL RETURNING a.id
