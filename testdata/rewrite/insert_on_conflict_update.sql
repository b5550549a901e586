-- ON CONFLICT DO UPDATE: C = excluded.C (the inserted row's token, t) and the row check against it as its WHERE.
-- input:
INSERT INTO accounts (id, balance) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET balance = accounts.balance + excluded.balance
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) INSERT INTO accounts (id, balance, fence_token) VALUES ($1, $2, {{t}}) ON CONFLICT (id) DO UPDATE SET balance = accounts.balance + excluded.balance, fence_token = excluded.fence_token WHERE CASE WHEN COALESCE(accounts.fence_token, 0) OPERATOR(pg_catalog.<=) excluded.fence_token THEN true ELSE pg_catalog.concat('fenceproxy|55F01|', accounts.fence_token, '|', excluded.fence_token, '|accounts|.')::bigint IS NULL END
