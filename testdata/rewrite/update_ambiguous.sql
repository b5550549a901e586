-- a.dup and b.dup have different token columns: an unqualified dup cannot be fenced.
-- input:
UPDATE dup SET x = 1 WHERE id = 1
-- output:
-- action: refuse
-- code: 55F04
-- table: a.dup
-- message: unfenceable write: dup may be a.dup or b.dup, which have different token columns; qualify the table name
