-- ON CONFLICT DO UPDATE ... WHERE, with an alias: the WHERE is guarded.
-- input:
INSERT INTO accounts AS a (id, balance) VALUES (1, 1) ON CONFLICT (id) DO UPDATE SET balance = excluded.balance WHERE a.balance < excluded.balance
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) INSERT INTO accounts AS a (id, balance, fence_token) VALUES (1, 1, {{t}}) ON CONFLICT (id) DO UPDATE SET balance = excluded.balance, fence_token = excluded.fence_token WHERE CASE WHEN a.balance < excluded.balance THEN CASE WHEN COALESCE(a.fence_token, 0) OPERATOR(pg_catalog.<=) excluded.fence_token THEN true ELSE pg_catalog.concat('fenceproxy|55F01|', a.fence_token, '|', excluded.fence_token, '|accounts|.')::bigint IS NULL END ELSE false END
