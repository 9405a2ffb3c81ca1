-- A run's kind: which handler runs it, fixed at create. Runs created before this migration, and
-- runs created without a kind, are of the kind 'default'. Adding a column with a constant
-- default rewrites no row.
ALTER TABLE runs ADD COLUMN kind TEXT COLLATE "C" NOT NULL DEFAULT 'default';

-- claim_next takes one kind: its pick walks that kind's entries only, in claimable order, and
-- the lagging held entries it moves forward are that kind's too. Renewals change neither
-- column, so they stay HOT updates.
DROP INDEX runs_claimable;
CREATE INDEX runs_claimable ON runs (kind, claimable_at, created_seq) WHERE state = 'runnable';
DROP INDEX runs_held;
CREATE INDEX runs_held ON runs (kind, claimable_at) WHERE state = 'runnable' AND lease_owner IS NOT NULL;
