-- Multi-row VALUES whose items may run code (a function, a cast to a type found through search_path): every row
-- reads the statement's token, so nothing a row runs changes the token of a later row.
-- input:
INSERT INTO accounts (id, created) VALUES (1, now()), (2, '2024-01-01'::date)
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) INSERT INTO accounts (fence_token, id, created) VALUES ({{t}}, 1, now()), ({{t}}, 2, '2024-01-01'::date)
