-- SET ... TO DEFAULT passes.
-- input:
SET fence.token TO DEFAULT
-- output:
-- action: pass
