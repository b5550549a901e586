-- "fence"."token" is the same setting.
-- input:
SET "fence"."token" = 'x'
-- output:
-- action: refuse
-- code: 55F03
-- message: invalid fencing token: "x" is not an integer in 1..9223372036854775807
