-- $1 the most to count per figure
-- Returns: one row, a figure per part of a run's life (and the queue's lag), each counted up to $1 through the
-- partial index that holds it, so one call's work is bounded by $1 per figure (per kind for the
-- runnable figures, plus the held runs the delayed count walks past in runs_claimable).
--
-- runs_claimable is led by (kind, priority, queue) and runs_held by the kind, so the runnable
-- figures are counted part by part: the (kind, priority, queue) parts with runnable runs are
-- found by skipping through runs_claimable (one probe per part: a loose index scan; at most ten
-- priorities per kind and queue), then each part's range (for held runs, each kind's) is
-- counted up to $1, and the sum is capped at $1.
-- Continues sql/runnable_parts.sql, prepended when the statement is loaded: its `parts`.
, kinds AS (
    SELECT DISTINCT kind FROM parts
)
SELECT
  (SELECT least(coalesce(sum(n), 0), $1)::bigint FROM parts, LATERAL (
     SELECT count(*) AS n FROM (
       SELECT 1 FROM {schema}.runs r
       WHERE r.state = 'runnable' AND r.kind = parts.kind AND r.priority = parts.priority
         AND r.queue = parts.queue
         AND r.claimable_at <= now()
         AND (r.lease_owner IS NULL OR r.lease_expires_at <= now())
       LIMIT $1) c) k) AS claimable,
  (SELECT least(coalesce(sum(n), 0), $1)::bigint FROM kinds, LATERAL (
     SELECT count(*) AS n FROM (
       SELECT 1 FROM {schema}.runs r
       WHERE r.state = 'runnable' AND r.kind = kinds.kind AND r.lease_owner IS NOT NULL
         AND r.lease_expires_at > now()
       LIMIT $1) c) k) AS held,
  (SELECT least(coalesce(sum(n), 0), $1)::bigint FROM parts, LATERAL (
     SELECT count(*) AS n FROM (
       SELECT 1 FROM {schema}.runs r
       WHERE r.state = 'runnable' AND r.kind = parts.kind AND r.priority = parts.priority
         AND r.queue = parts.queue
         AND r.lease_owner IS NULL AND r.claimable_at > now()
       LIMIT $1) c) k) AS delayed,
  (SELECT count(*) FROM (
     SELECT 1 FROM {schema}.runs WHERE state = 'suspended' LIMIT $1) c) AS suspended,
  (SELECT count(*) FROM (
     SELECT 1 FROM {schema}.runs WHERE state = 'completed' LIMIT $1) c) AS completed,
  (SELECT count(*) FROM (
     SELECT 1 FROM {schema}.runs WHERE state = 'failed' LIMIT $1) c) AS failed,
  (SELECT count(*) FROM (
     SELECT 1 FROM {schema}.runs WHERE state = 'cancelled' LIMIT $1) c) AS cancelled,
  -- The queue's lag in microseconds (NULL: nothing claimable): the earliest instant a
  -- claimable run became so. An unowned run's is its claimable_at (the first of each part's
  -- range, read from runs_claimable, walking past held runs' entries); an expired lease's is
  -- its expiry (runs_held, at most $1 per kind, as the held figure walks).
  (SELECT (extract(epoch FROM now() - min(since)) * 1000000)::bigint FROM (
     SELECT (SELECT r.claimable_at FROM {schema}.runs r
             WHERE r.state = 'runnable' AND r.kind = parts.kind AND r.priority = parts.priority
               AND r.queue = parts.queue
               AND r.lease_owner IS NULL AND r.claimable_at <= now()
             ORDER BY r.claimable_at LIMIT 1) AS since
     FROM parts
     UNION ALL
     SELECT (SELECT min(h.lease_expires_at) FROM (
               SELECT r.lease_expires_at FROM {schema}.runs r
               WHERE r.state = 'runnable' AND r.kind = kinds.kind AND r.lease_owner IS NOT NULL
                 AND r.lease_expires_at <= now()
               LIMIT $1) h) AS since
     FROM kinds) s) AS oldest_claimable_us,
  -- The longest-held lease in microseconds (NULL: nothing held): from the earliest claim among
  -- the held runs, read through runs_held as the held figure walks it, at most $1 per kind.
  (SELECT (extract(epoch FROM now() - min(first)) * 1000000)::bigint FROM (
     SELECT (SELECT min(h.claimed_at) FROM (
               SELECT r.claimed_at FROM {schema}.runs r
               WHERE r.state = 'runnable' AND r.kind = kinds.kind AND r.lease_owner IS NOT NULL
                 AND r.lease_expires_at > now()
               LIMIT $1) h) AS first
     FROM kinds) s) AS longest_held_us
