-- INSERT ... SELECT DISTINCT naming C: replacing its output would change which rows are distinct: refused.
-- input:
INSERT INTO accounts (id, fence_token) SELECT DISTINCT id, fence_token FROM staging
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: INSERT into accounts ... SELECT: cannot replace the output for the token column fence_token (a *, DISTINCT, or GROUP BY/ORDER BY by position); list the outputs or leave the column out
