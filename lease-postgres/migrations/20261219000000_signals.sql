-- Signals (lease_core::signal): a suspended run may wait for a named signal until a deadline,
-- and a run keeps how its last wait ended until it waits again. Nullable columns: adding them
-- rewrites no row, and a run that never waits keeps them null.
ALTER TABLE runs
    -- The wait: its signal's name, its deadline (null: none), and the fence of the lease that
    -- began it, which a signal's token must name. All null unless the run waits.
    ADD COLUMN wait_name TEXT COLLATE "C",
    ADD COLUMN wait_deadline TIMESTAMPTZ,
    ADD COLUMN wait_fence BIGINT,
    -- How the last wait ended: its name and fence, when (the signal's arrival, or the
    -- deadline), and the signal's payload (null: it timed out). All null until a wait ends.
    ADD COLUMN resumed_name TEXT COLLATE "C",
    ADD COLUMN resumed_fence BIGINT,
    ADD COLUMN resumed_at TIMESTAMPTZ,
    ADD COLUMN resumed_payload BYTEA;

-- A wait past its deadline is claimable: claim_next walks a kind's and queue's timed waits in
-- deadline order, through this index, before its claimable runs. Only timed waits are in it.
CREATE INDEX runs_waits ON runs (kind, queue, wait_deadline)
    WHERE state = 'suspended' AND wait_deadline IS NOT NULL;
