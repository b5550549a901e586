-- Positional INSERT ... SELECT is refused too.
-- input:
INSERT INTO accounts SELECT * FROM staging
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: INSERT into accounts without a column list cannot be fenced; name the columns
