-- INSERT ... SELECT: t (the statement's token) appended to the target list, plus the one-time filter.
-- input:
INSERT INTO accounts (id, balance) SELECT id, 0 FROM staging WHERE ok
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) INSERT INTO accounts (id, balance, fence_token) SELECT id, 0, {{t}} FROM staging WHERE ok AND {{t}} IS NOT NULL
