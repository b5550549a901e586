-- SET of a valid token passes and reports it.
-- input:
SET fence.token = 42
-- output:
-- action: pass
-- token: 42
