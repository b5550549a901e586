-- A set operation is wrapped: SELECT fenceproxy_src.*, t FROM (...) AS fenceproxy_src.
-- input:
INSERT INTO accounts (id, balance) SELECT id, 0 FROM a UNION ALL SELECT id, 1 FROM b
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) INSERT INTO accounts (id, balance, fence_token) SELECT fenceproxy_src.*, {{t}} FROM (SELECT id, 0 FROM a UNION ALL SELECT id, 1 FROM b) fenceproxy_src WHERE {{t}} IS NOT NULL
