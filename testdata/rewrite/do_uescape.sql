-- A U& identifier with UESCAPE inside a DO body.
-- input:
DO $$BEGIN DELETE FROM U&"!0061ccounts" UESCAPE '!'; END$$
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: a DO block that writes accounts cannot be fenced; run its statements through the proxy as plain SQL
