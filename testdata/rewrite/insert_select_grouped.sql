-- An aggregate SELECT: t is an uncorrelated subquery, allowed beside GROUP BY.
-- input:
INSERT INTO accounts (id, balance) SELECT account_id, sum(amount) FROM transfers GROUP BY account_id HAVING sum(amount) > 0
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) INSERT INTO accounts (id, balance, fence_token) SELECT account_id, sum(amount), {{t}} FROM transfers WHERE {{t}} IS NOT NULL GROUP BY account_id HAVING sum(amount) > 0
