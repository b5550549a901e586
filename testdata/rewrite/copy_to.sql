-- COPY TO is a read.
-- input:
COPY accounts TO STDOUT
-- output:
-- action: pass
