-- DO UPDATE SET C = excluded.C (override): C is written as excluded.C, the inserted row's token, once.
-- input:
INSERT INTO accounts (id) VALUES (1) ON CONFLICT (id) DO UPDATE SET fence_token = excluded.fence_token
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) INSERT INTO accounts (id, fence_token) VALUES (1, {{t}}) ON CONFLICT (id) DO UPDATE SET fence_token = CASE WHEN false THEN excluded.fence_token::bigint ELSE excluded.fence_token END WHERE CASE WHEN COALESCE(accounts.fence_token, 0) OPERATOR(pg_catalog.<=) excluded.fence_token THEN true ELSE pg_catalog.concat('fenceproxy|55F01|', accounts.fence_token, '|', excluded.fence_token, '|accounts|.')::bigint IS NULL END
