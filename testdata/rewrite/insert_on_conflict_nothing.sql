-- DO NOTHING: only the INSERT is fenced.
-- input:
INSERT INTO accounts (id, balance) VALUES (1, 2) ON CONFLICT DO NOTHING
-- output:
-- action: rewrite
-- tables: accounts
INSERT INTO accounts (id, balance, fence_token) VALUES (1, 2, {{k accounts}}) ON CONFLICT DO NOTHING
