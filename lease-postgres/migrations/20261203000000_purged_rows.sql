-- A purged run keeps its row, in state 'purged', with its fence and nothing else: the tombstone
-- is the row itself. Before this, purge deleted the row and wrote the fence to `tombstones`,
-- and create read that table in its statement snapshot while the INSERT's conflict check
-- waited for a concurrent purge and then saw the row gone: the id came back at fence 0 and
-- its next claim issued a fence the purged incarnation had already issued. With the row kept,
-- create and purge decide on the same row's latest version under its row lock (see
-- sql/create.sql), and a snapshot that predates a purge makes create fail with a
-- serialization failure instead of inserting below the fence.
ALTER TABLE runs DROP CONSTRAINT runs_state_check;
ALTER TABLE runs ADD CONSTRAINT runs_state_check
    CHECK (state IN ('runnable', 'suspended', 'completed', 'failed', 'purged'));

-- A live run that the race created below its tombstone is raised to it: a holder of a lease
-- below is then refused as stale, and the next claim continues above the tombstone.
UPDATE runs r SET fence = t.fence
FROM tombstones t
WHERE t.run_id = r.run_id AND r.fence < t.fence;

INSERT INTO runs (run_id, state, fence, claimable_at)
SELECT t.run_id, 'purged', t.fence, now()
FROM tombstones t
ON CONFLICT (run_id) DO NOTHING;

-- Dropped, not left behind: a process of an older release still running against this schema
-- then fails its purge and create loudly instead of reading a table nobody writes.
DROP TABLE tombstones;
