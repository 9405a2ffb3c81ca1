-- $1 queue, $2 the most kinds
-- Returns: the kinds with runnable runs in the queue (the first $2 by name), for the wake-ups a
-- resume of the queue sends. Found as count_kinds.sql finds its parts: by skipping through
-- runs_claimable from one (kind, priority, queue) to the next, one probe per part, so the work
-- is bounded by the parts, not by the runs.
-- Continues sql/runnable_parts.sql, prepended when the statement is loaded: its `parts`.
SELECT DISTINCT kind FROM parts WHERE queue = $1 ORDER BY kind LIMIT $2
