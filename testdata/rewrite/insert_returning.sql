-- RETURNING is kept.
-- input:
INSERT INTO accounts (id, balance) VALUES (1, 2) RETURNING *
-- output:
-- action: rewrite
-- tables: accounts
INSERT INTO accounts (id, balance, fence_token) VALUES (1, 2, {{k accounts}}) RETURNING *
