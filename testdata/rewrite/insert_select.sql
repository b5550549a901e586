-- INSERT ... SELECT: k appended to the target list, plus the one-time filter.
-- input:
INSERT INTO accounts (id, balance) SELECT id, 0 FROM staging WHERE ok
-- output:
-- action: rewrite
-- tables: accounts
INSERT INTO accounts (id, balance, fence_token) SELECT id, 0, {{k accounts}} FROM staging WHERE ok AND {{k accounts}} IS NOT NULL
