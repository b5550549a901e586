-- Comments cannot split a keyword or a name; a comment between tokens hides nothing.
-- input:
UPDATE/**/accounts/* x */SET balance = 0 -- c
WHERE id = 1
-- output:
-- action: rewrite
-- tables: accounts
UPDATE accounts SET balance = 0, fence_token = {{light accounts}} WHERE id = 1 AND CASE WHEN id = 1 THEN CASE WHEN COALESCE(accounts.fence_token, 0) <= {{light accounts}} THEN true ELSE (((('fenceproxy|55F01|' || accounts.fence_token::text) || '|') || pg_catalog.ltrim(pg_catalog.current_setting('fence.token'), '0')) || '|accounts|.')::int8 IS NULL END ELSE false END AND {{k accounts}} IS NOT NULL
