-- Reading a protected table in a CTE passes.
-- input:
WITH x AS (SELECT * FROM accounts) SELECT * FROM x
-- output:
-- action: pass
