-- A negative number with a subscript or a field selection: the deparser prints (-1)[1] as -1[1], which reads as
-- the minus of 1[1] (a syntax error, not the client's statement); the rewrite gives it - 1, which the deparser
-- parenthesises and the parser folds back into -1: (- 1)[1] and (- 1.5).f mean what the client wrote.
-- input:
UPDATE accounts SET balance = (-1)[1], note = (-1.5).f WHERE id = (-2147483648)[1]
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) UPDATE accounts SET balance = (- 1)[1], note = (- 1.5).f, fence_token = (SELECT CASE WHEN COALESCE(accounts.fence_token, 0) OPERATOR(pg_catalog.<=) fenceproxy_stmt.token THEN fenceproxy_stmt.token ELSE pg_catalog.concat('fenceproxy|55F01|', accounts.fence_token, '|', fenceproxy_stmt.token, '|accounts|.')::bigint END FROM fenceproxy_stmt) WHERE id = (- 2147483648)[1] AND {{t}} IS NOT NULL
