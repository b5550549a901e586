-- DDL passes.
-- input:
ALTER TABLE accounts ADD COLUMN note text
-- output:
-- action: pass
