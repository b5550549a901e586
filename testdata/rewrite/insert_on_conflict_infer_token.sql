-- The token column as a conflict target is not a write of it.
-- input:
INSERT INTO accounts (id) VALUES (1) ON CONFLICT (fence_token) DO NOTHING
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) INSERT INTO accounts (id, fence_token) VALUES (1, {{t}}) ON CONFLICT (fence_token) DO NOTHING
