-- CREATE RULE actions are not analysed (documented limit): the proxy passes the statement. The write its
-- action runs later happens inside the server, where the in-database guard (fenceproxy install: row triggers
-- on every protected table, branch install) fences it; a rule ON a protected table is DDL the proxy refuses
-- (contract, DDL; branch ddlscope). Pinned as pass until that work lands.
-- input:
CREATE RULE r AS ON INSERT TO queue DO ALSO UPDATE accounts SET balance = 0
-- output:
-- action: pass
