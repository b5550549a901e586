-- A set operation is wrapped: SELECT fenceproxy_src.*, k FROM (...) AS fenceproxy_src.
-- input:
INSERT INTO accounts (id, balance) SELECT id, 0 FROM a UNION ALL SELECT id, 1 FROM b
-- output:
-- action: rewrite
-- tables: accounts
INSERT INTO accounts (id, balance, fence_token) SELECT fenceproxy_src.*, {{k accounts}} FROM (SELECT id, 0 FROM a UNION ALL SELECT id, 1 FROM b) fenceproxy_src WHERE {{k accounts}} IS NOT NULL
