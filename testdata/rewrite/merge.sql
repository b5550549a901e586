-- MERGE into a protected table is refused.
-- input:
MERGE INTO accounts a USING src s ON a.id = s.id WHEN MATCHED THEN UPDATE SET balance = s.balance WHEN NOT MATCHED THEN INSERT (id, balance) VALUES (s.id, s.balance)
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: MERGE into accounts cannot be fenced; use INSERT ... ON CONFLICT, UPDATE or DELETE
