-- $1 application_name of this store's own sessions (or null), $2 wait bound in ms, $3 one
-- session's process id (or null)
-- Cancels the statements of this store's own sessions, or of that one session, that have
-- waited on a synchronous standby longer than the bound. Postgres then ends the wait with a
-- WARNING and the commit stands locally; the caller checks the standbys itself and reports the
-- write as unavailable. Never touches a session of the caller's pool that it was not told of.
-- Returns: one row per session.
SELECT pg_cancel_backend(pid) AS cancelled
FROM pg_stat_activity
WHERE (application_name = $1 OR pid = $3)
  AND wait_event = 'SyncRep'
  AND clock_timestamp() - state_change >= $2::bigint * interval '1 millisecond'
