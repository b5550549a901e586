-- Reads pass.
-- input:
SELECT balance FROM accounts WHERE id = $1
-- output:
-- action: pass
