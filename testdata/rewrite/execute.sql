-- EXECUTE passes: its statement was fenced at PREPARE.
-- input:
EXECUTE upd(1, 2)
-- output:
-- action: pass
