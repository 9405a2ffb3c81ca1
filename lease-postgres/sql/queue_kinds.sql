-- $1 queue, $2 the most kinds
-- Returns: the kinds with runnable runs in the queue (the first $2 by name), for the wake-ups a
-- resume of the queue sends. Found as count_kinds.sql finds its parts: by skipping through
-- runs_claimable from one (kind, priority, queue) to the next, one probe per part, so the work
-- is bounded by the parts, not by the runs.
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
SELECT DISTINCT kind FROM parts WHERE queue = $1 ORDER BY kind LIMIT $2
