-- Zero is not a token.
-- input:
SET fence.token = 0
-- output:
-- action: refuse
-- code: 55F03
-- message: invalid fencing token: "0" is not an integer in 1..9223372036854775807
