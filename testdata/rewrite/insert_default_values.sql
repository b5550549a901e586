-- DEFAULT VALUES becomes (C) VALUES (k).
-- input:
INSERT INTO accounts DEFAULT VALUES
-- output:
-- action: rewrite
-- tables: accounts
INSERT INTO accounts (fence_token) VALUES ({{k accounts}})
