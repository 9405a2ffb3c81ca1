-- $1 the most to count per figure
-- Returns: one row, a figure per part of a run's life, each counted up to $1 through the
-- partial index that holds it (so one call's work is bounded by $1 per figure, plus the held
-- runs the delayed count walks past in runs_claimable).
SELECT
  (SELECT count(*) FROM (
     SELECT 1 FROM {schema}.runs
     WHERE state = 'runnable' AND claimable_at <= now()
       AND (lease_owner IS NULL OR lease_expires_at <= now())
     LIMIT $1) c) AS claimable,
  (SELECT count(*) FROM (
     SELECT 1 FROM {schema}.runs
     WHERE state = 'runnable' AND lease_owner IS NOT NULL AND lease_expires_at > now()
     LIMIT $1) c) AS held,
  (SELECT count(*) FROM (
     SELECT 1 FROM {schema}.runs
     WHERE state = 'runnable' AND lease_owner IS NULL AND claimable_at > now()
     LIMIT $1) c) AS delayed,
  (SELECT count(*) FROM (
     SELECT 1 FROM {schema}.runs WHERE state = 'suspended' LIMIT $1) c) AS suspended,
  (SELECT count(*) FROM (
     SELECT 1 FROM {schema}.runs WHERE state = 'completed' LIMIT $1) c) AS completed,
  (SELECT count(*) FROM (
     SELECT 1 FROM {schema}.runs WHERE state = 'failed' LIMIT $1) c) AS failed,
  (SELECT count(*) FROM (
     SELECT 1 FROM {schema}.runs WHERE state = 'cancelled' LIMIT $1) c) AS cancelled
