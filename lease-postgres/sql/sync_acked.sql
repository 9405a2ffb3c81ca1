-- $1 target LSN (text), or null for this server's WAL flush position now
-- Returns: the target, and how many synchronous (or quorum) standbys have flushed WAL up to it.
-- Called after a commit returned: the commit's record ends at or before the flush position, so a
-- standby that flushed the target holds the commit (and everything committed before it).
SELECT t.lsn::text AS target,
       (SELECT count(*) FROM pg_stat_replication r
        WHERE r.sync_state IN ('sync', 'quorum') AND r.flush_lsn >= t.lsn) AS acked
FROM (SELECT coalesce($1::pg_lsn, pg_current_wal_flush_lsn()) AS lsn) AS t
