-- Audit is configured with a capital: only the quoted name matches.
-- input:
UPDATE "Audit" SET note = 'x' WHERE id = 1
-- output:
-- action: rewrite
-- tables: Audit
UPDATE "Audit" SET note = 'x', fence_token = {{light accounts}} WHERE id = 1 AND CASE WHEN id = 1 THEN CASE WHEN COALESCE("Audit".fence_token, 0) <= {{light accounts}} THEN true ELSE (((('fenceproxy|55F01|' || "Audit".fence_token::text) || '|') || pg_catalog.ltrim(pg_catalog.current_setting('fence.token'), '0')) || '|Audit|.')::int8 IS NULL END ELSE false END AND {{k Audit}} IS NOT NULL
