-- Text is invalid.
-- input:
SET fence.token = 'abc'
-- output:
-- action: refuse
-- code: 55F03
-- message: invalid fencing token: "abc" is not an integer in 1..9223372036854775807
