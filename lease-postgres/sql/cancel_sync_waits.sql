-- $1 application_name of this store's sessions, $2 wait bound in ms
-- Cancels this store's statements that have waited on a synchronous standby longer than the
-- bound. Postgres then ends the wait with a WARNING and the commit stands locally; the caller
-- checks the standbys itself and reports the write as unavailable. Returns: one row per session.
SELECT pg_cancel_backend(pid) AS cancelled
FROM pg_stat_activity
WHERE application_name = $1
  AND wait_event = 'SyncRep'
  AND clock_timestamp() - state_change >= $2::bigint * interval '1 millisecond'
