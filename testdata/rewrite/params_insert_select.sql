-- Parameters are preserved in INSERT ... SELECT.
-- input:
INSERT INTO accounts (id, balance) SELECT $1, $2 WHERE $3
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) INSERT INTO accounts (id, balance, fence_token) SELECT $1, $2, {{t}} WHERE $3 AND {{t}} IS NOT NULL
