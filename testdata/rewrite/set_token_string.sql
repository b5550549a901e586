-- SET ... TO 'literal', LOCAL.
-- input:
SET LOCAL fence.token TO '0042'
-- output:
-- action: pass
-- token: 42
