-- DO blocks are not analysed (documented limit).
-- input:
DO $$ BEGIN UPDATE accounts SET balance = 0; END $$
-- output:
-- action: pass
