-- Text the parser rejects that mentions a protected table is refused.
-- input:
UPDATE accounts SET WHERE id = 1
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: cannot parse a statement that mentions accounts: syntax error at or near "WHERE"
