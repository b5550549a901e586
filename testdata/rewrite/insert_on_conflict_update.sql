-- ON CONFLICT DO UPDATE: C = k and the row check as its WHERE.
-- input:
INSERT INTO accounts (id, balance) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET balance = accounts.balance + excluded.balance
-- output:
-- action: rewrite
-- tables: accounts
INSERT INTO accounts (id, balance, fence_token) VALUES ($1, $2, {{k accounts}}) ON CONFLICT (id) DO UPDATE SET balance = accounts.balance + excluded.balance, fence_token = {{light accounts}} WHERE CASE WHEN COALESCE(accounts.fence_token, 0) <= {{light accounts}} THEN true ELSE (((('fenceproxy|55F01|' || accounts.fence_token::text) || '|') || pg_catalog.ltrim(pg_catalog.current_setting('fence.token'), '0')) || '|accounts|.')::int8 IS NULL END
