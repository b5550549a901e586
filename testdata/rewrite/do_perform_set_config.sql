-- A DO block that sets the token with set_config is refused.
-- input:
DO $$BEGIN PERFORM set_config('fence.token', '99', false); END$$
-- output:
-- action: refuse
-- code: 55F03
-- message: invalid fencing token: a DO block that sets fence.token cannot have its token checked; use SET fence.token = <token>
