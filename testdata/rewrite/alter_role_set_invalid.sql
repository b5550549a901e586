-- An invalid token in ALTER ROLE ... SET is refused too (it is not the session token).
-- input:
ALTER ROLE app SET fence.token = 'abc'
-- output:
-- action: refuse
-- code: 55F03
-- message: invalid fencing token: "abc" is not an integer in 1..9223372036854775807
