-- set_config of another setting passes.
-- input:
SELECT set_config('app.user', 'x', false)
-- output:
-- action: pass
