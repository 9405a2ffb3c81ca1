-- $1 the most queues listed
-- Returns: every queue with runnable runs (found in the skip-scan's parts) or ever paused or
-- resumed (the queues table), by name, with its state and when it last changed (µs since the
-- Unix epoch on the database clock; NULL and not paused for a queue never paused or resumed).
-- Continues sql/runnable_parts.sql, prepended when the statement is loaded: its `parts`.
, named AS (
    SELECT parts.queue FROM parts
    UNION
    SELECT q.queue FROM {schema}.queues q
)
SELECT named.queue, coalesce(q.paused, false) AS paused,
       (extract(epoch FROM q.changed_at) * 1000000)::bigint AS changed_us
FROM named LEFT JOIN {schema}.queues q ON q.queue = named.queue
ORDER BY named.queue
LIMIT $1
