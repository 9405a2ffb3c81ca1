-- $1 the most to count per figure, $2 the most kinds
-- Returns: one row per kind with runnable runs, the first $2 by name: its runnable runs
-- (claimable, held or delayed), those claimable now, and its queue lag in microseconds (NULL:
-- nothing claimable), each figure counted up to $1 through the partial indexes that hold it,
-- as count.sql counts them for the whole store: one call's work is bounded by $2 kinds times
-- $1 runs per figure.
-- Continues sql/runnable_parts.sql, prepended when the statement is loaded: its `parts`.
, kinds AS (
    SELECT DISTINCT kind FROM parts ORDER BY kind LIMIT $2
)
SELECT kinds.kind,
  (SELECT count(*) FROM (
     SELECT 1 FROM {schema}.runs r
     WHERE r.state = 'runnable' AND r.kind = kinds.kind
     LIMIT $1) c) AS runnable,
  (SELECT least(coalesce(sum(n), 0), $1)::bigint FROM parts, LATERAL (
     SELECT count(*) AS n FROM (
       SELECT 1 FROM {schema}.runs r
       WHERE r.state = 'runnable' AND r.kind = parts.kind AND r.priority = parts.priority
         AND r.queue = parts.queue
         AND r.claimable_at <= now()
         AND (r.lease_owner IS NULL OR r.lease_expires_at <= now())
       LIMIT $1) c) k
   WHERE parts.kind = kinds.kind) AS claimable,
  -- As count.sql: an unowned run's claimable_at (the first of each part's range), or an
  -- expired lease's expiry (runs_held, at most $1).
  (SELECT (extract(epoch FROM now() - min(since)) * 1000000)::bigint FROM (
     SELECT (SELECT r.claimable_at FROM {schema}.runs r
             WHERE r.state = 'runnable' AND r.kind = parts.kind AND r.priority = parts.priority
               AND r.queue = parts.queue
               AND r.lease_owner IS NULL AND r.claimable_at <= now()
             ORDER BY r.claimable_at LIMIT 1) AS since
     FROM parts WHERE parts.kind = kinds.kind
     UNION ALL
     SELECT (SELECT min(h.lease_expires_at) FROM (
               SELECT r.lease_expires_at FROM {schema}.runs r
               WHERE r.state = 'runnable' AND r.kind = kinds.kind AND r.lease_owner IS NOT NULL
                 AND r.lease_expires_at <= now()
               LIMIT $1) h) AS since) s) AS oldest_claimable_us
FROM kinds
ORDER BY kinds.kind
