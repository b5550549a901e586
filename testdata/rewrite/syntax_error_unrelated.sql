-- Text the parser rejects that mentions no protected table passes (the server reports the error).
-- input:
UPDATE fence_stats SET WHERE
-- output:
-- action: pass
