-- A run's whole life: a terminal 'failed' state with its reason, and releases with a retry
-- delay. A delay needs no column: claimable_at already says when a runnable run becomes
-- claimable, claim_next already skips a run until then, and claim now checks it too.
-- For a completed or failed run, claimable_at is when it ended.
ALTER TABLE runs DROP CONSTRAINT runs_state_check;
ALTER TABLE runs ADD CONSTRAINT runs_state_check
    CHECK (state IN ('runnable', 'suspended', 'completed', 'failed'));
-- The reason an End::Fail gave; null for every run that is not failed.
ALTER TABLE runs ADD COLUMN failure TEXT;
ALTER TABLE runs ADD CONSTRAINT runs_failure_only_when_failed
    CHECK ((failure IS NULL) OR (state = 'failed'));

-- Retention. purge removes ended runs oldest end first: for a completed or failed run,
-- claimable_at is when it ended, and this index finds them without walking live runs.
CREATE INDEX runs_ended ON runs (claimable_at) WHERE state IN ('completed', 'failed');
-- A purged run's last fence, kept for good (a few bytes per purged id): a run created again
-- under the id starts at this fence, so no fence is ever issued twice for one run id.
CREATE TABLE tombstones (
    run_id TEXT COLLATE "C" PRIMARY KEY,
    fence  BIGINT NOT NULL CHECK (fence >= 0)
);

-- count: suspended runs through an index of their own, as every other state has one
-- (runs_claimable, runs_held, runs_ended).
CREATE INDEX runs_suspended ON runs (claimable_at) WHERE state = 'suspended';
