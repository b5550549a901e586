-- SQL-standard function bodies are not analysed (documented limit): the proxy passes the statement. The body
-- runs later inside the server, where the in-database guard (fenceproxy install: row triggers on every
-- protected table, branch install) fences its writes. Pinned as pass until that work lands.
-- input:
CREATE FUNCTION zero() RETURNS void LANGUAGE sql BEGIN ATOMIC UPDATE accounts SET balance = 0; END
-- output:
-- action: pass
