-- Row locks are not writes.
-- input:
SELECT * FROM accounts WHERE id = 1 FOR UPDATE
-- output:
-- action: pass
