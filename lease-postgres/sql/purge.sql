-- $1 age in ms, $2 most runs
-- Returns: the ids of the runs removed. Up to $2 runs that ended (completed or failed) at least
-- $1 ms ago by the database clock, oldest end first, found through runs_ended; rows locked by
-- another transaction are skipped. Each leaves a tombstone with its last fence (kept at the
-- highest seen), and its journal goes with it, in the same statement (the journal's foreign
-- key is checked at its end, when both are gone).
WITH doomed AS (
    SELECT run_id, fence
    FROM {schema}.runs
    WHERE state IN ('completed', 'failed')
      AND claimable_at <= now() - $1::bigint * interval '1 millisecond'
    ORDER BY claimable_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), entries AS (
    DELETE FROM {schema}.journal j
    WHERE j.run_id = ANY ((SELECT array_agg(doomed.run_id) FROM doomed)::text[])
), buried AS (
    INSERT INTO {schema}.tombstones (run_id, fence)
    SELECT run_id, fence FROM doomed
    ON CONFLICT (run_id) DO UPDATE SET fence = greatest({schema}.tombstones.fence, excluded.fence)
)
DELETE FROM {schema}.runs r
WHERE r.run_id = ANY ((SELECT array_agg(doomed.run_id) FROM doomed)::text[])
RETURNING r.run_id
