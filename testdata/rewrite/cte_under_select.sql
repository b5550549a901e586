-- A write in a CTE under SELECT.
-- input:
WITH moved AS (UPDATE accounts SET balance = 0 WHERE id = 1 RETURNING id) SELECT * FROM moved
-- output:
-- action: rewrite
-- tables: accounts
WITH moved AS (UPDATE accounts SET balance = 0, fence_token = {{light accounts}} WHERE id = 1 AND CASE WHEN id = 1 THEN CASE WHEN COALESCE(accounts.fence_token, 0) <= {{light accounts}} THEN true ELSE (((('fenceproxy|55F01|' || accounts.fence_token::text) || '|') || pg_catalog.ltrim(pg_catalog.current_setting('fence.token'), '0')) || '|accounts|.')::int8 IS NULL END ELSE false END AND {{k accounts}} IS NOT NULL RETURNING id) SELECT * FROM moved
