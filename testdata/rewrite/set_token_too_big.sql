-- One more than the largest token.
-- input:
SET fence.token = 9223372036854775808
-- output:
-- action: refuse
-- code: 55F03
-- message: invalid fencing token: "9223372036854775808" is not an integer in 1..9223372036854775807
