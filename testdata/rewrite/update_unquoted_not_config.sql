-- Unquoted Audit folds to audit, which is not the configured "Audit".
-- input:
UPDATE Audit SET note = 'x' WHERE id = 1
-- output:
-- action: pass
