-- A set operation's WITH moves to the wrapper.
-- input:
INSERT INTO accounts (id) WITH s AS (SELECT 1 AS id) SELECT id FROM s UNION SELECT 2
-- output:
-- action: rewrite
-- tables: accounts
INSERT INTO accounts (id, fence_token) WITH s AS (SELECT 1 AS id) SELECT fenceproxy_src.*, {{k accounts}} FROM (SELECT id FROM s UNION SELECT 2) fenceproxy_src WHERE {{k accounts}} IS NOT NULL
