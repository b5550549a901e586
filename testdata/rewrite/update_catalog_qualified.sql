-- db.schema.table: the reference keeps all parts.
-- input:
UPDATE mydb.public.accounts SET balance = 1 WHERE id = 2
-- output:
-- action: rewrite
-- tables: accounts
UPDATE mydb.public.accounts SET balance = 1, fence_token = {{light accounts}} WHERE id = 2 AND CASE WHEN id = 2 THEN CASE WHEN COALESCE(mydb.public.accounts.fence_token, 0) <= {{light accounts}} THEN true ELSE (((('fenceproxy|55F01|' || mydb.public.accounts.fence_token::text) || '|') || pg_catalog.ltrim(pg_catalog.current_setting('fence.token'), '0')) || '|accounts|.')::int8 IS NULL END ELSE false END AND {{k accounts}} IS NOT NULL
