-- INSERT with a column list: C and k appended.
-- input:
INSERT INTO accounts (id, balance) VALUES ($1, $2)
-- output:
-- action: rewrite
-- tables: accounts
INSERT INTO accounts (id, balance, fence_token) VALUES ($1, $2, {{k accounts}})
