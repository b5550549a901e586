-- DO NOTHING: only the INSERT is fenced.
-- input:
INSERT INTO accounts (id, balance) VALUES (1, 2) ON CONFLICT DO NOTHING
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) INSERT INTO accounts (id, balance, fence_token) VALUES (1, 2, {{t}}) ON CONFLICT DO NOTHING
