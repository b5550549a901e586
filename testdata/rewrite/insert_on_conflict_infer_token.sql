-- The token column as a conflict target is not a write of it.
-- input:
INSERT INTO accounts (id) VALUES (1) ON CONFLICT (fence_token) DO NOTHING
-- output:
-- action: rewrite
-- tables: accounts
INSERT INTO accounts (id, fence_token) VALUES (1, {{k accounts}}) ON CONFLICT (fence_token) DO NOTHING
