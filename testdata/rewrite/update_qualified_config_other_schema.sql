-- public.ledger is configured: other.ledger is another table.
-- input:
UPDATE other.ledger SET amount = 1 WHERE id = 1
-- output:
-- action: pass
