-- Retention deletes. A purge used to keep each purged run's row (state 'purged', its fence) so
-- that the id, created again, continued above every fence it had carried: one row per purged
-- id, forever. Now a purge deletes the run's rows and raises the schema's fence floor to its
-- fence; every run is created at the floor, and the first claim of a run's life takes its
-- fence above the floor as the claim reads it (sql/claim.sql), so an id created again never
-- reuses a fence however its creation raced the purge. One row of bookkeeping per schema.
CREATE TABLE fence_floor (
    one   BOOLEAN PRIMARY KEY DEFAULT true CHECK (one),
    fence BIGINT NOT NULL CHECK (fence >= 0)
);
INSERT INTO fence_floor (fence)
SELECT coalesce(max(fence), 0) FROM runs WHERE state = 'purged';

-- The purged rows' journals and payloads were deleted by their purge; the rows go now.
DELETE FROM journal j USING runs r WHERE r.run_id = j.run_id AND r.state = 'purged';
DELETE FROM run_payloads p USING runs r WHERE r.run_id = p.run_id AND r.state = 'purged';
DELETE FROM runs WHERE state = 'purged';

ALTER TABLE runs DROP CONSTRAINT runs_state_check;
ALTER TABLE runs ADD CONSTRAINT runs_state_check
    CHECK (state IN ('runnable', 'suspended', 'completed', 'failed', 'cancelled')) NOT VALID;
ALTER TABLE runs VALIDATE CONSTRAINT runs_state_check;

-- Every create names the fence it starts at (the floor). A process of an older release still
-- running against this schema creates without it: its insert fails on the NOT NULL column
-- instead of starting a purged id at fence 0, and its purge fails on the state check.
ALTER TABLE runs ALTER COLUMN fence DROP DEFAULT;
