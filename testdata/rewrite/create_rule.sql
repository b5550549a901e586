-- DDL naming a protected table is refused unless allowlisted (ddl.go): a rule whose action writes it is refused.
-- input:
CREATE RULE r AS ON INSERT TO queue DO ALSO UPDATE accounts SET balance = 0
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: a rule on or writing accounts could redirect or add writes outside the fence; run such a migration directly against PostgreSQL, not through fenceproxy (see docs/ddl.md)
