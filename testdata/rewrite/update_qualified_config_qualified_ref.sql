-- public.ledger, qualified.
-- input:
UPDATE public.ledger AS l SET amount = 1 WHERE l.id = 1
-- output:
-- action: rewrite
-- tables: public.ledger
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k public.ledger}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) UPDATE public.ledger l SET amount = 1, fence = (SELECT CASE WHEN COALESCE(l.fence, 0) OPERATOR(pg_catalog.<=) fenceproxy_stmt.token THEN fenceproxy_stmt.token ELSE pg_catalog.concat('fenceproxy|55F01|', l.fence, '|', fenceproxy_stmt.token, '|public.ledger|.')::bigint END FROM fenceproxy_stmt) WHERE l.id = 1 AND {{t}} IS NOT NULL
