-- Several statements: each write fenced, all deparsed.
-- input:
BEGIN; UPDATE accounts SET balance = balance - 1 WHERE id = 1; INSERT INTO accounts (id, balance) VALUES (2, 1); SELECT 1; COMMIT
-- output:
-- action: rewrite
-- tables: accounts
BEGIN; UPDATE accounts SET balance = balance - 1, fence_token = {{light accounts}} WHERE id = 1 AND CASE WHEN id = 1 THEN CASE WHEN COALESCE(accounts.fence_token, 0) <= {{light accounts}} THEN true ELSE (((('fenceproxy|55F01|' || accounts.fence_token::text) || '|') || pg_catalog.ltrim(pg_catalog.current_setting('fence.token'), '0')) || '|accounts|.')::int8 IS NULL END ELSE false END AND {{k accounts}} IS NOT NULL; INSERT INTO accounts (id, balance, fence_token) VALUES (2, 1, {{k accounts}}); SELECT 1; COMMIT
