-- public.ledger is configured: an unqualified reference may be it.
-- input:
UPDATE ledger SET amount = 1 WHERE id = 1
-- output:
-- action: rewrite
-- tables: public.ledger
UPDATE ledger SET amount = 1, fence = {{light accounts}} WHERE id = 1 AND CASE WHEN id = 1 THEN CASE WHEN COALESCE(ledger.fence, 0) <= {{light accounts}} THEN true ELSE (((('fenceproxy|55F01|' || ledger.fence::text) || '|') || pg_catalog.ltrim(pg_catalog.current_setting('fence.token'), '0')) || '|public.ledger|.')::int8 IS NULL END ELSE false END AND {{k public.ledger}} IS NOT NULL
