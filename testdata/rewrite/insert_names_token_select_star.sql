-- INSERT ... SELECT * naming C: which output fills C cannot be told: refused.
-- input:
INSERT INTO accounts (id, fence_token) SELECT * FROM staging
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: INSERT into accounts ... SELECT: cannot replace the output for the token column fence_token (a *, DISTINCT, or GROUP BY/ORDER BY by position); list the outputs or leave the column out
