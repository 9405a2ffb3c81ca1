-- $1 the ids (text[])
-- Returns: the ids of the runs purged: those of $1 that ended (completed, failed or
-- cancelled), whatever their age; rows locked by another transaction are skipped. Each is
-- removed as sql/purge.sql removes a run: its journal and payload with it, and the fence
-- floor raised to its fence in the same statement.
WITH doomed AS (
    SELECT run_id
    FROM {schema}.runs
    WHERE run_id = ANY ($1::text[])
      AND state IN ('completed', 'failed', 'cancelled')
    FOR UPDATE SKIP LOCKED
-- sql/purge_remove.sql follows, closing this CTE.
