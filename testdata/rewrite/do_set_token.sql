-- A DO block that SETs the token is refused.
-- input:
DO $$BEGIN SET fence.token = 99; END$$
-- output:
-- action: refuse
-- code: 55F03
-- message: invalid fencing token: a DO block that sets fence.token cannot have its token checked; use SET fence.token = <token>
