-- ON CONFLICT DO UPDATE ... WHERE, with an alias: the WHERE is guarded.
-- input:
INSERT INTO accounts AS a (id, balance) VALUES (1, 1) ON CONFLICT (id) DO UPDATE SET balance = excluded.balance WHERE a.balance < excluded.balance
-- output:
-- action: rewrite
-- tables: accounts
INSERT INTO accounts AS a (id, balance, fence_token) VALUES (1, 1, {{k accounts}}) ON CONFLICT (id) DO UPDATE SET balance = excluded.balance, fence_token = {{light accounts}} WHERE CASE WHEN a.balance < excluded.balance THEN CASE WHEN COALESCE(a.fence_token, 0) <= {{light accounts}} THEN true ELSE (((('fenceproxy|55F01|' || a.fence_token::text) || '|') || pg_catalog.ltrim(pg_catalog.current_setting('fence.token'), '0')) || '|accounts|.')::int8 IS NULL END ELSE false END
