-- A read of a protected table has no write keyword: the prefilter passes it without parsing.
-- input:
SELECT abalance FROM accounts WHERE id = 42
-- output:
-- action: pass
