-- (no parameters)
-- Returns: this server's WAL insert position, past the end of every record inserted so far
-- (a commit that returned, synchronous or not, included).
SELECT pg_current_wal_insert_lsn()::text AS lsn
