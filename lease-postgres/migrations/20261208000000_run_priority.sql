-- A run's priority: 0 (the default, the lowest) to 9, fixed at create; within a kind, claim_next
-- takes the highest priority first. Adding a column with a constant default rewrites no row.
ALTER TABLE runs ADD COLUMN priority SMALLINT NOT NULL DEFAULT 0 CHECK (priority BETWEEN 0 AND 9);

-- claim_next walks a kind's priorities from the highest down, each priority's entries in
-- claimable order: the index is led by (kind, priority), so each priority's claimable range is
-- one index range. Renewals change none of these columns, so they stay HOT updates.
DROP INDEX runs_claimable;
CREATE INDEX runs_claimable ON runs (kind, priority, claimable_at, created_seq) WHERE state = 'runnable';
