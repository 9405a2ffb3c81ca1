-- $1 age in ms, $2 most runs, $3 the ended states to purge (text[]: of completed, failed,
-- cancelled)
-- Returns: the ids of the runs purged. Up to $2 runs that ended in one of $3 at least $1 ms
-- ago by the database clock, oldest end first, found through runs_ended; rows locked by
-- another transaction are skipped. Each run is deleted with its journal and payload, and the
-- schema's fence floor is raised to its fence in the same statement (sql/purge_remove.sql): a run created afterwards starts at the floor (sql/create.sql), and the first
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
-- sql/purge_remove.sql follows, closing this CTE.
