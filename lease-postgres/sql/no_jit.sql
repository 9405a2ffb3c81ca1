-- Turns JIT compilation off for the rest of the current transaction: for a statement whose
-- planner estimate is large (count.sql's bounded parts add up to millions of cost units) but
-- whose work is index probes and bounded scans, compiling it costs more than running it.
SET LOCAL jit = off
