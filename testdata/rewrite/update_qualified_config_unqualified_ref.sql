-- public.ledger is configured: an unqualified reference may be it.
-- input:
UPDATE ledger SET amount = 1 WHERE id = 1
-- output:
-- action: rewrite
-- tables: public.ledger
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k public.ledger}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) UPDATE ledger SET amount = 1, fence = (SELECT CASE WHEN COALESCE(ledger.fence, 0) OPERATOR(pg_catalog.<=) fenceproxy_stmt.token THEN fenceproxy_stmt.token ELSE pg_catalog.concat('fenceproxy|55F01|', ledger.fence, '|', fenceproxy_stmt.token, '|public.ledger|.')::bigint END FROM fenceproxy_stmt) WHERE id = 1 AND {{t}} IS NOT NULL
