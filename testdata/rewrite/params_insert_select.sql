-- Parameters are preserved in INSERT ... SELECT.
-- input:
INSERT INTO accounts (id, balance) SELECT $1, $2 WHERE $3
-- output:
-- action: rewrite
-- tables: accounts
INSERT INTO accounts (id, balance, fence_token) SELECT $1, $2, {{k accounts}} WHERE $3 AND {{k accounts}} IS NOT NULL
