-- INSERT ... SELECT naming C (override): that output is replaced; the one-time filter is added.
-- input:
INSERT INTO accounts (id, fence_token, balance) SELECT id, fence_token, 0 FROM staging
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) INSERT INTO accounts (id, fence_token, balance) SELECT id, CASE WHEN false THEN fence_token::bigint ELSE {{t}} END, 0 FROM staging WHERE {{t}} IS NOT NULL
