-- INSERT with a column list: C and t, the statement's token, appended; the statement-token CTE in its WITH.
-- input:
INSERT INTO accounts (id, balance) VALUES ($1, $2)
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) INSERT INTO accounts (id, balance, fence_token) VALUES ($1, $2, {{t}})
