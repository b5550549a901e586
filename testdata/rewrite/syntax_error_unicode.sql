-- Unparsable text with a unicode-escaped identifier may hide a protected name: refused.
-- input:
UPDATE U&"\0061ccounts" SET WHERE
-- output:
-- action: refuse
-- code: 55F04
-- message: unfenceable write: cannot parse a statement with unicode-escaped names, which may hide a protected table: syntax error at or near "WHERE"
