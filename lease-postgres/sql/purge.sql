-- $1 age in ms, $2 most runs
-- Returns: the ids of the runs purged. Up to $2 runs that ended (completed, failed or
-- cancelled) at least
-- $1 ms ago by the database clock, oldest end first, found through runs_ended; rows locked by
-- another transaction are skipped. Each run's journal, payload and attempt history are deleted and its row kept as its
-- tombstone: state 'purged', its fence and nothing else, invisible to every read. A create of
-- the id revives the row at that fence (sql/create.sql), so no fence is ever issued twice.
WITH doomed AS (
    SELECT run_id
    FROM {schema}.runs
    WHERE state IN ('completed', 'failed', 'cancelled')
      AND claimable_at <= now() - $1::bigint * interval '1 millisecond'
    ORDER BY claimable_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), entries AS (
    DELETE FROM {schema}.journal j
    WHERE j.run_id = ANY ((SELECT array_agg(doomed.run_id) FROM doomed)::text[])
), payloads AS (
    DELETE FROM {schema}.run_payloads p
    WHERE p.run_id = ANY ((SELECT array_agg(doomed.run_id) FROM doomed)::text[])
)
UPDATE {schema}.runs r
SET state = 'purged', heartbeats = 0, journal_len = 0, failure = NULL, attempts = 0, history = '[]',
    claimable_at = now()
WHERE r.run_id = ANY ((SELECT array_agg(doomed.run_id) FROM doomed)::text[])
RETURNING r.run_id
