-- A VALUES row with more values than columns (PostgreSQL rejects it too): where C's value goes cannot be told.
-- input:
INSERT INTO accounts (a) VALUES (0, 0)
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: INSERT into accounts: a VALUES row has 2 values for 1 columns
