-- Naming the token column is refused.
-- input:
INSERT INTO accounts (id, fence_token) VALUES (1, 5)
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token) INSERT INTO accounts (id, fence_token) VALUES (1, CASE WHEN false THEN 5::bigint ELSE {{t}} END)
