-- set_config with an invalid constant is refused.
-- input:
SELECT pg_catalog.set_config('fence.token', 'nope', true)
-- output:
-- action: refuse
-- code: 55F03
-- message: invalid fencing token: "nope" is not an integer in 1..9223372036854775807
