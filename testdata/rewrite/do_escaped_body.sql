-- A DO body spelled with E'' escapes is decoded before analysis (\x6f is o).
-- input:
DO E'BEGIN UPDATE acc\x6funts SET balance = 0; END'
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: a DO block that writes accounts cannot be fenced; run its statements through the proxy as plain SQL
