-- The prefix of count.sql, count_kinds.sql, queue_kinds.sql and queues.sql (each continues
-- it): `parts`, every (kind, priority, queue) with runnable runs, found by skipping through
-- runs_claimable (kind, priority, queue, claimable_at, created_seq) from one part to the next,
-- one index probe per part (a loose index scan), so the work is bounded by the parts, not by
-- the runs.
WITH RECURSIVE parts(kind, priority, queue) AS (
    (SELECT kind, priority, queue FROM {schema}.runs WHERE state = 'runnable'
     ORDER BY kind, priority, queue LIMIT 1)
  UNION ALL
    SELECT later.kind, later.priority, later.queue
    FROM parts, LATERAL (
        SELECT r.kind, r.priority, r.queue FROM {schema}.runs r
        WHERE r.state = 'runnable' AND (r.kind, r.priority, r.queue) > (parts.kind, parts.priority, parts.queue)
        ORDER BY r.kind, r.priority, r.queue LIMIT 1) AS later
)
