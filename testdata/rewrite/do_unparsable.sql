-- A DO body that PL/pgSQL cannot parse and that names a protected table is refused.
-- input:
DO $$BEGIN UPDATE accounts SET ( END$$
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: cannot parse a DO block that names accounts: PL/pgSQL: unexpected end of function definition at end of input
