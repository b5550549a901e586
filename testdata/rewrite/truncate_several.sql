-- TRUNCATE of a list including a protected table.
-- input:
TRUNCATE other, public.ledger CASCADE
-- output:
-- action: refuse
-- code: 55F04
-- table: public.ledger
-- message: unfenceable write: TRUNCATE of public.ledger cannot be fenced
