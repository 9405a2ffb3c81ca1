-- $1 age in ms, $2 most runs, $3 the ended states to purge (text[]: of completed, failed,
-- cancelled)
-- Returns: the ids of the runs purged. Up to $2 runs that ended in one of $3 at least $1 ms
-- ago by the database clock, oldest end first, found through runs_ended; rows locked by another transaction are skipped. Each run is deleted with its
-- journal and payload, and the schema's fence floor is raised to its fence in the same
-- statement: a run created afterwards starts at the floor (sql/create.sql), and the first
-- claim of a run's life takes its fence above the floor (sql/claim.sql), so the id, created
-- again, never reuses a fence. Nothing of the run stays behind.
WITH doomed AS (
    SELECT run_id
    FROM {schema}.runs
    WHERE state IN ('completed', 'failed', 'cancelled')
      AND state = ANY ($3::text[])
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
), gone AS (
    DELETE FROM {schema}.runs r
    WHERE r.run_id = ANY ((SELECT array_agg(doomed.run_id) FROM doomed)::text[])
    RETURNING r.run_id, r.fence
), raised AS (
    UPDATE {schema}.fence_floor f
    SET fence = greatest(f.fence, (SELECT max(gone.fence) FROM gone))
    WHERE EXISTS (SELECT 1 FROM gone)
)
SELECT run_id FROM gone
