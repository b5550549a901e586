-- VALUES with a set operation is wrapped like any set operation.
-- input:
INSERT INTO accounts (id) VALUES (1) UNION VALUES (2)
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) INSERT INTO accounts (id, fence_token) SELECT fenceproxy_src.*, {{t}} FROM (VALUES (1) UNION VALUES (2)) fenceproxy_src WHERE {{t}} IS NOT NULL
