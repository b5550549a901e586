-- set_config with constants reports the token.
-- input:
SELECT set_config('fence.token', '42', false)
-- output:
-- action: pass
-- token: 42
