-- Queues: every run is in one (fixed at create; 'default' for runs created before this
-- migration or without one), and a claim takes runs of one queue and one kind. Adding a column
-- with a constant default rewrites no row.
ALTER TABLE runs ADD COLUMN queue TEXT COLLATE "C" NOT NULL DEFAULT 'default';

-- claim_next walks one (kind, priority, queue) range in claimable order; the counts find the
-- parts with runnable runs by skipping from one (kind, priority, queue) to the next. The queue
-- comes after the priority so that a kind's priorities stay one prefix each. Renewals change
-- none of these columns, so they stay HOT updates.
DROP INDEX runs_claimable;
CREATE INDEX runs_claimable ON runs (kind, priority, queue, claimable_at, created_seq)
    WHERE state = 'runnable';

-- A queue's pause, fleet-wide: claim_next reads it in its own statement, so no claim that
-- starts after a pause committed takes a run of the queue. A queue never paused has no row.
CREATE TABLE queues (
    queue TEXT COLLATE "C" PRIMARY KEY,
    paused BOOLEAN NOT NULL,
    changed_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
