-- A set operation's WITH moves to the wrapper.
-- input:
INSERT INTO accounts (id) WITH s AS (SELECT 1 AS id) SELECT id FROM s UNION SELECT 2
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) INSERT INTO accounts (id, fence_token) WITH s AS (SELECT 1 AS id) SELECT fenceproxy_src.*, {{t}} FROM (SELECT id FROM s UNION SELECT 2) fenceproxy_src WHERE {{t}} IS NOT NULL
