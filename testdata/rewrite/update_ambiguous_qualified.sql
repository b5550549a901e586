-- b.dup, qualified, uses its own token column.
-- input:
UPDATE b.dup SET x = 1 WHERE id = 1
-- output:
-- action: rewrite
-- tables: b.dup
UPDATE b.dup SET x = 1, t2 = {{light accounts}} WHERE id = 1 AND CASE WHEN id = 1 THEN CASE WHEN COALESCE(b.dup.t2, 0) <= {{light accounts}} THEN true ELSE (((('fenceproxy|55F01|' || b.dup.t2::text) || '|') || pg_catalog.ltrim(pg_catalog.current_setting('fence.token'), '0')) || '|b.dup|.')::int8 IS NULL END ELSE false END AND {{k b.dup}} IS NOT NULL
