-- A DELETE in a CTE feeding an INSERT: both fenced.
-- input:
WITH gone AS (DELETE FROM accounts WHERE id = 1 RETURNING *) INSERT INTO accounts (id, balance) SELECT id + 1000, balance FROM gone
-- output:
-- action: rewrite
-- tables: accounts
WITH gone AS (DELETE FROM accounts WHERE id = 1 AND CASE WHEN id = 1 THEN CASE WHEN COALESCE(accounts.fence_token, 0) <= {{light accounts}} THEN true ELSE (((('fenceproxy|55F01|' || accounts.fence_token::text) || '|') || pg_catalog.ltrim(pg_catalog.current_setting('fence.token'), '0')) || '|accounts|.')::int8 IS NULL END ELSE false END AND {{k accounts}} IS NOT NULL RETURNING *) INSERT INTO accounts (id, balance, fence_token) SELECT id + 1000, balance, {{k accounts}} FROM gone WHERE {{k accounts}} IS NOT NULL
