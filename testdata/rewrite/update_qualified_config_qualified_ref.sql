-- public.ledger, qualified.
-- input:
UPDATE public.ledger AS l SET amount = 1 WHERE l.id = 1
-- output:
-- action: rewrite
-- tables: public.ledger
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k public.ledger}} AS token) UPDATE public.ledger l SET amount = 1, fence = {{t}} WHERE l.id = 1 AND CASE WHEN l.id = 1 THEN CASE WHEN COALESCE(l.fence, 0) OPERATOR(pg_catalog.<=) {{t}} THEN true ELSE pg_catalog.concat('fenceproxy|55F01|', l.fence, '|', {{t}}, '|public.ledger|.')::bigint IS NULL END ELSE false END AND {{t}} IS NOT NULL
