-- (no parameters)
-- Run on every new connection. Returns: whether the server is a standby, its
-- synchronous_standby_names, how many synchronous (or quorum) standbys stream from it, how many
-- other physical standbys (or sessions of unknown kind: a role without pg_read_all_stats sees
-- only their pids) replicate from it, and the two settings under which an acknowledged commit
-- can be lost: fsync (server-wide) and this session's synchronous_commit (the store sets it to
-- on; role, database or options could still have changed what the session sees).
-- A logical subscriber (its walsender holds a logical slot) is no failover target and is not
-- counted; neither is a base backup in progress.
SELECT pg_is_in_recovery() AS in_recovery,
       current_setting('synchronous_standby_names') AS standby_names,
       (SELECT count(*) FROM pg_stat_replication
        WHERE state = 'streaming' AND sync_state IN ('sync', 'quorum')) AS sync_standbys,
       (SELECT count(*) FROM pg_stat_replication r
        WHERE (r.state IS NULL OR r.state IN ('startup', 'catchup', 'streaming'))
          AND (r.sync_state IS NULL OR r.sync_state NOT IN ('sync', 'quorum'))
          AND NOT EXISTS (SELECT 1 FROM pg_replication_slots s
                          WHERE s.active_pid = r.pid AND s.slot_type = 'logical')) AS other_standbys,
       current_setting('fsync') AS fsync,
       current_setting('synchronous_commit') AS synchronous_commit
