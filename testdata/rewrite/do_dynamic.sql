-- A DO block with dynamic SQL passes: EXECUTE of a string is a documented limit (the in-database guard covers it).
-- input:
DO $$BEGIN EXECUTE 'UPDATE ' || 'acc' || 'ounts SET balance = 0'; END$$
-- output:
-- action: pass
