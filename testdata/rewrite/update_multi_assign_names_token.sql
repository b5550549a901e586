-- A multi-column SET including the token column is refused: assign it alone.
-- input:
UPDATE accounts SET (balance, fence_token) = (1, 2) WHERE id = 1
-- output:
-- action: refuse
-- code: 55F04
-- table: accounts
-- message: unfenceable write: UPDATE of accounts assigns the token column fence_token in a multiple-column assignment; assign it alone (SET fence_token = ...)
