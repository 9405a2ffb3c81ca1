-- $1 target LSN (text), or null for this server's WAL insert position now (past the end of
-- every record inserted so far: a commit that returned, synchronous or not, included)
-- Returns: the target, and whether this server's WAL is flushed up to it.
SELECT t.lsn::text AS target, pg_current_wal_flush_lsn() >= t.lsn AS flushed
FROM (SELECT coalesce($1::pg_lsn, pg_current_wal_insert_lsn()) AS lsn) AS t
