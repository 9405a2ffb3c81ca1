-- (no parameters)
-- Run on every new connection. Returns: whether the server is a standby, its
-- synchronous_standby_names, and how many synchronous (or quorum) standbys stream from it.
SELECT pg_is_in_recovery() AS in_recovery,
       current_setting('synchronous_standby_names') AS standby_names,
       (SELECT count(*) FROM pg_stat_replication
        WHERE state = 'streaming' AND sync_state IN ('sync', 'quorum')) AS sync_standbys
