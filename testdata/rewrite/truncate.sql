-- TRUNCATE cannot be fenced.
-- input:
TRUNCATE accounts
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: TRUNCATE of accounts cannot be fenced
