-- set_config with a parameter: dynamic, checked at the write.
-- input:
SELECT set_config('fence.token', $1, false)
-- output:
-- action: pass
-- token: dynamic
