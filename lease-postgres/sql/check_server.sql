-- (no parameters)
-- Run on every new connection. Returns: whether the server is a standby, its
-- synchronous_standby_names, how many synchronous (or quorum) standbys stream from it, and the
-- two settings under which an acknowledged commit can be lost: fsync (server-wide) and this
-- session's synchronous_commit (the store sets it to on; role, database or options could
-- still have changed what the session sees).
SELECT pg_is_in_recovery() AS in_recovery,
       current_setting('synchronous_standby_names') AS standby_names,
       (SELECT count(*) FROM pg_stat_replication
        WHERE state = 'streaming' AND sync_state IN ('sync', 'quorum')) AS sync_standbys,
       current_setting('fsync') AS fsync,
       current_setting('synchronous_commit') AS synchronous_commit
