-- A DO block in another language that names a protected table is refused.
-- input:
DO LANGUAGE plperl $$ spi_exec_query('UPDATE accounts SET balance = 0') $$
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: a DO block in LANGUAGE plperl that names accounts cannot be analysed; run its statements through the proxy as plain SQL
