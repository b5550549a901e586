-- A bit string holding a backslash is no bit string (the server rejects it), and the deparser would print it as
-- bE'...', the type name be and a string (a cast to a type be, if there is one): refused, not rewritten.
-- input:
UPDATE accounts SET flags = B'10\01' WHERE id = 1
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write to accounts: a bit string constant holding a backslash (not a valid bit string), which cannot be rewritten exactly
