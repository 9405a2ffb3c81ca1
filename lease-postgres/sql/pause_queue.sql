-- $1 queue, $2 paused (true: pause, false: resume)
-- Returns: the queue's state as stored, and when it last changed (µs since the Unix epoch on the
-- database clock). Sending the same change twice leaves its first time. The transaction commits
-- synchronously whatever the session says: a pause that returned holds back every claim after it.
INSERT INTO {schema}.queues AS q (queue, paused, changed_at)
SELECT $1, $2, now()
FROM (SELECT set_config('synchronous_commit', 'on', true)) AS durable
ON CONFLICT (queue) DO UPDATE
    SET paused = excluded.paused,
        changed_at = CASE WHEN q.paused = excluded.paused THEN q.changed_at
                          ELSE excluded.changed_at END
RETURNING queue, paused, (extract(epoch FROM changed_at) * 1000000)::bigint AS changed_us
