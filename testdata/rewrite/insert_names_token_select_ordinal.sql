-- INSERT ... SELECT naming C with ORDER BY by position: refused; by name (SQLAlchemy's insertmanyvalues) is fenced.
-- input:
INSERT INTO accounts (id, fence_token) SELECT p0, p1 FROM (VALUES ($1, $2, 0)) AS imp(p0, p1, n) ORDER BY 2
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: INSERT into accounts ... SELECT: cannot replace the output for the token column fence_token (a *, DISTINCT, or GROUP BY/ORDER BY by position); list the outputs or leave the column out
