-- Multi-row VALUES: the first row carries k (validated once), later rows the setting's value.
-- input:
INSERT INTO accounts (id, balance) VALUES (1, 10), (2, 20), (3, DEFAULT)
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token) INSERT INTO accounts (id, balance, fence_token) VALUES (1, 10, {{t}}), (2, 20, {{light accounts}}), (3, DEFAULT, {{light accounts}})
