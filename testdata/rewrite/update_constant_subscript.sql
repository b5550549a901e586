-- A constant other than a negative number with a subscript or field selection: the deparser would print (1)[1]
-- as 1[1] (a syntax error); no constant has subscripts or fields, so PostgreSQL rejects the statement anyway:
-- refused.
-- input:
UPDATE accounts SET balance = (-0)[1] WHERE id = ('{1}')[1]
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write to accounts: a constant with a subscript or field selection, which PostgreSQL rejects and the deparser cannot print as written
