-- CREATE RULE actions are not analysed (documented limit).
-- input:
CREATE RULE r AS ON INSERT TO queue DO ALSO UPDATE accounts SET balance = 0
-- output:
-- action: pass
