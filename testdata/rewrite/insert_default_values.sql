-- DEFAULT VALUES becomes (C) VALUES (t), t the statement's token.
-- input:
INSERT INTO accounts DEFAULT VALUES
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) INSERT INTO accounts (fence_token) VALUES ({{t}})
