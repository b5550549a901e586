-- SQL-standard function bodies are not analysed (documented limit).
-- input:
CREATE FUNCTION zero() RETURNS void LANGUAGE sql BEGIN ATOMIC UPDATE accounts SET balance = 0; END
-- output:
-- action: pass
