-- A DELETE in the WITH of an UPDATE, and a write to another protected table.
-- input:
WITH d AS (DELETE FROM accounts WHERE id = 2 RETURNING balance), l AS (INSERT INTO ledger (account_id, amount) SELECT 1, balance FROM d RETURNING amount) UPDATE accounts SET balance = balance + (SELECT sum(amount) FROM l) WHERE id = 1
-- output:
-- action: rewrite
-- tables: accounts, public.ledger
WITH d AS (DELETE FROM accounts WHERE id = 2 AND CASE WHEN id = 2 THEN CASE WHEN COALESCE(accounts.fence_token, 0) <= {{light accounts}} THEN true ELSE (((('fenceproxy|55F01|' || accounts.fence_token::text) || '|') || pg_catalog.ltrim(pg_catalog.current_setting('fence.token'), '0')) || '|accounts|.')::int8 IS NULL END ELSE false END AND {{k accounts}} IS NOT NULL RETURNING balance), l AS (INSERT INTO ledger (account_id, amount, fence) SELECT 1, balance, {{k public.ledger}} FROM d WHERE {{k public.ledger}} IS NOT NULL RETURNING amount) UPDATE accounts SET balance = balance + (SELECT sum(amount) FROM l), fence_token = {{light accounts}} WHERE id = 1 AND CASE WHEN id = 1 THEN CASE WHEN COALESCE(accounts.fence_token, 0) <= {{light accounts}} THEN true ELSE (((('fenceproxy|55F01|' || accounts.fence_token::text) || '|') || pg_catalog.ltrim(pg_catalog.current_setting('fence.token'), '0')) || '|accounts|.')::int8 IS NULL END ELSE false END AND {{k accounts}} IS NOT NULL
