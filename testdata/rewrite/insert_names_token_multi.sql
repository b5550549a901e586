-- C named in a multi-row VALUES (override): literal, NULL, DEFAULT all become the token; rows after the first
-- read the setting directly, since no item can run code.
-- input:
INSERT INTO accounts (fence_token, id) VALUES (1, 1), (NULL, 2), (DEFAULT, 3)
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) INSERT INTO accounts (fence_token, id) VALUES (CASE WHEN false THEN 1::bigint ELSE {{t}} END, 1), (CASE WHEN false THEN NULL::bigint ELSE {{light accounts}} END, 2), ({{light accounts}}, 3)
