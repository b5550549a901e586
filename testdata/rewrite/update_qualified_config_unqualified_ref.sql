-- public.ledger is configured: an unqualified reference may be it.
-- input:
UPDATE ledger SET amount = 1 WHERE id = 1
-- output:
-- action: rewrite
-- tables: public.ledger
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k public.ledger}} AS token) UPDATE ledger SET amount = 1, fence = {{t}} WHERE id = 1 AND CASE WHEN id = 1 THEN CASE WHEN COALESCE(ledger.fence, 0) OPERATOR(pg_catalog.<=) {{t}} THEN true ELSE pg_catalog.concat('fenceproxy|55F01|', ledger.fence, '|', {{t}}, '|public.ledger|.')::bigint IS NULL END ELSE false END AND {{t}} IS NOT NULL
