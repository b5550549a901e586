-- The largest token.
-- input:
SET fence.token = 9223372036854775807
-- output:
-- action: pass
-- token: 9223372036854775807
