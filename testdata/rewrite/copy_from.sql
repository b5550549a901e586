-- COPY FROM cannot be fenced.
-- input:
COPY accounts (id, balance) FROM STDIN
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: COPY FROM into accounts cannot be fenced; use INSERT
