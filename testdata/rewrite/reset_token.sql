-- RESET passes.
-- input:
RESET fence.token
-- output:
-- action: pass
