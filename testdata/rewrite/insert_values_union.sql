-- VALUES with a set operation is wrapped like any set operation.
-- input:
INSERT INTO accounts (id) VALUES (1) UNION VALUES (2)
-- output:
-- action: rewrite
-- tables: accounts
INSERT INTO accounts (id, fence_token) SELECT fenceproxy_src.*, {{k accounts}} FROM (VALUES (1) UNION VALUES (2)) fenceproxy_src WHERE {{k accounts}} IS NOT NULL
