-- $1 the most to count per figure
-- Returns: one row, a figure per part of a run's life, each counted up to $1 through the
-- partial index that holds it, so one call's work is bounded by $1 per figure (per kind for the
-- runnable figures, plus the held runs the delayed count walks past in runs_claimable).
--
-- runs_claimable and runs_held are led by the kind, so the runnable figures are counted kind by
-- kind: the kinds with runnable runs are found by skipping through runs_claimable (one probe per
-- kind: a loose index scan), then each kind's range is counted up to $1, and the sum is capped
-- at $1.
WITH RECURSIVE kinds(kind) AS (
    (SELECT kind FROM {schema}.runs WHERE state = 'runnable' ORDER BY kind LIMIT 1)
  UNION ALL
    SELECT (SELECT r.kind FROM {schema}.runs r
            WHERE r.state = 'runnable' AND r.kind > kinds.kind
            ORDER BY r.kind LIMIT 1)
    FROM kinds
    WHERE kinds.kind IS NOT NULL
)
SELECT
  (SELECT least(coalesce(sum(n), 0), $1)::bigint FROM kinds, LATERAL (
     SELECT count(*) AS n FROM (
       SELECT 1 FROM {schema}.runs r
       WHERE r.state = 'runnable' AND r.kind = kinds.kind AND r.claimable_at <= now()
         AND (r.lease_owner IS NULL OR r.lease_expires_at <= now())
       LIMIT $1) c) k) AS claimable,
  (SELECT least(coalesce(sum(n), 0), $1)::bigint FROM kinds, LATERAL (
     SELECT count(*) AS n FROM (
       SELECT 1 FROM {schema}.runs r
       WHERE r.state = 'runnable' AND r.kind = kinds.kind AND r.lease_owner IS NOT NULL
         AND r.lease_expires_at > now()
       LIMIT $1) c) k) AS held,
  (SELECT least(coalesce(sum(n), 0), $1)::bigint FROM kinds, LATERAL (
     SELECT count(*) AS n FROM (
       SELECT 1 FROM {schema}.runs r
       WHERE r.state = 'runnable' AND r.kind = kinds.kind AND r.lease_owner IS NULL
         AND r.claimable_at > now()
       LIMIT $1) c) k) AS delayed,
  (SELECT count(*) FROM (
     SELECT 1 FROM {schema}.runs WHERE state = 'suspended' LIMIT $1) c) AS suspended,
  (SELECT count(*) FROM (
     SELECT 1 FROM {schema}.runs WHERE state = 'completed' LIMIT $1) c) AS completed,
  (SELECT count(*) FROM (
     SELECT 1 FROM {schema}.runs WHERE state = 'failed' LIMIT $1) c) AS failed,
  (SELECT count(*) FROM (
     SELECT 1 FROM {schema}.runs WHERE state = 'cancelled' LIMIT $1) c) AS cancelled
