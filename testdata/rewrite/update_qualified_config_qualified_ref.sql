-- public.ledger, qualified.
-- input:
UPDATE public.ledger AS l SET amount = 1 WHERE l.id = 1
-- output:
-- action: rewrite
-- tables: public.ledger
UPDATE public.ledger l SET amount = 1, fence = {{light accounts}} WHERE l.id = 1 AND CASE WHEN l.id = 1 THEN CASE WHEN COALESCE(l.fence, 0) <= {{light accounts}} THEN true ELSE (((('fenceproxy|55F01|' || l.fence::text) || '|') || pg_catalog.ltrim(pg_catalog.current_setting('fence.token'), '0')) || '|public.ledger|.')::int8 IS NULL END ELSE false END AND {{k public.ledger}} IS NOT NULL
