-- A DO block that only reads a protected table passes.
-- input:
DO $$DECLARE n int; BEGIN SELECT count(*) INTO n FROM accounts; RAISE NOTICE $q$%$q$, n; END$$
-- output:
-- action: pass
