-- MERGE in a CTE (PostgreSQL 17) is refused like MERGE.
-- input:
WITH m AS (MERGE INTO accounts a USING src s ON a.id = s.id WHEN MATCHED THEN DELETE RETURNING a.id) SELECT * FROM m
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: MERGE into accounts cannot be fenced; use INSERT ... ON CONFLICT, UPDATE or DELETE
