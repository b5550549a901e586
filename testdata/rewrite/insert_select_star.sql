-- SELECT * gets k after the star.
-- input:
INSERT INTO accounts (id, balance) SELECT * FROM staging
-- output:
-- action: rewrite
-- tables: accounts
INSERT INTO accounts (id, balance, fence_token) SELECT *, {{k accounts}} FROM staging WHERE {{k accounts}} IS NOT NULL
