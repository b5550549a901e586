-- SELECT * gets t after the star.
-- input:
INSERT INTO accounts (id, balance) SELECT * FROM staging
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token) INSERT INTO accounts (id, balance, fence_token) SELECT *, {{t}} FROM staging WHERE {{t}} IS NOT NULL
