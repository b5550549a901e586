-- COPY TO of an ambiguous name is a read: it passes.
-- input:
COPY dup TO STDOUT
-- output:
-- action: pass
