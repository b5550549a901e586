-- SELECT * gets t after the star.
-- input:
INSERT INTO accounts (id, balance) SELECT * FROM staging
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) INSERT INTO accounts (id, balance, fence_token) SELECT *, {{t}} FROM staging WHERE {{t}} IS NOT NULL
