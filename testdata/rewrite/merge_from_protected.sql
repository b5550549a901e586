-- MERGE reading a protected table into another passes.
-- input:
MERGE INTO other o USING accounts a ON o.id = a.id WHEN MATCHED THEN DELETE
-- output:
-- action: pass
