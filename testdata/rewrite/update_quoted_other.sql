-- "Accounts" is a different table: not protected.
-- input:
UPDATE "Accounts" SET balance = 1 WHERE id = 2
-- output:
-- action: pass
