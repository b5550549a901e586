-- DDL naming a protected table is refused unless allowlisted (ddl.go): a SQL-standard body writing it is refused.
-- input:
CREATE FUNCTION zero() RETURNS void LANGUAGE sql BEGIN ATOMIC UPDATE accounts SET balance = 0; END
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: CreateFunctionStmt naming accounts is not among the DDL forms fenceproxy lets through; run such a migration directly against PostgreSQL, not through fenceproxy (see docs/ddl.md)
