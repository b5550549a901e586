-- Naming the token column (token_column_writes: override, the default): its value is kept only for its type
-- (CASE WHEN false: never evaluated) and the statement's token is written.
-- input:
INSERT INTO accounts (id, fence_token) VALUES (1, 5)
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) INSERT INTO accounts (id, fence_token) VALUES (1, CASE WHEN false THEN 5::bigint ELSE {{t}} END)
