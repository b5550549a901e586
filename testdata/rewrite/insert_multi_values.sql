-- Multi-row VALUES: C goes first (rows are built in the order written, so the statement's token is read before
-- anything else); the first row reads the statement's token, later rows the setting directly (no item runs code).
-- input:
INSERT INTO accounts (id, balance) VALUES (1, 10), (2, 20), (3, DEFAULT)
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) INSERT INTO accounts (fence_token, id, balance) VALUES ({{t}}, 1, 10), ({{light accounts}}, 2, 20), ({{light accounts}}, 3, DEFAULT)
