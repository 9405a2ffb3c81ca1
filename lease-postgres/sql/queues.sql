-- $1 the most queues listed
-- Returns: every queue ever paused or resumed, by name, with its state and when it last changed
-- (µs since the Unix epoch on the database clock).
SELECT queue, paused, (extract(epoch FROM changed_at) * 1000000)::bigint AS changed_us
FROM {schema}.queues
ORDER BY queue
LIMIT $1
