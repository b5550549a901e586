-- Negative tokens are invalid.
-- input:
SET fence.token = -5
-- output:
-- action: refuse
-- code: 55F03
-- message: invalid fencing token: "-5" is not an integer in 1..9223372036854775807
