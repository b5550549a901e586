-- The setting name is case-insensitive.
-- input:
SET FENCE.TOKEN = 7
-- output:
-- action: pass
-- token: 7
