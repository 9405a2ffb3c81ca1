-- The removal that sql/purge.sql and sql/purge_ids.sql share, appended to their `doomed`
-- CTE (the runs to remove, locked): each run's journal and payload go with it, and the fence
-- floor rises to the highest fence removed, in the same statement.
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
