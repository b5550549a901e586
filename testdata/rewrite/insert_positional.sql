-- Without a column list we cannot know where C goes.
-- input:
INSERT INTO accounts VALUES (1, 2)
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: INSERT into accounts without a column list cannot be fenced; name the columns
