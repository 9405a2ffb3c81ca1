-- $1 run_id, $2 floor_ms, $3 cap_ms
-- Returns: the run's fence verdict inputs and the session's process id, locking the row until the transaction ends, or no
-- row if the run does not exist. In the same round trip it bounds the transaction, on the
-- server, by bound_ms = the lease's time left on the database clock, at least floor_ms and at
-- most cap_ms: lock_timeout, statement_timeout and idle_in_transaction_session_timeout, all
-- transaction-local (set_config(.., true) is SET LOCAL). The row's own wait for this lock is
-- bounded by the session's lock_timeout.
SELECT r.state, r.lease_owner, r.fence, b.ms AS bound_ms,
       set_config('idle_in_transaction_session_timeout', b.ms::text, true) AS idle_bound,
       set_config('statement_timeout', b.ms::text, true) AS statement_bound,
       set_config('lock_timeout', b.ms::text, true) AS lock_bound,
       -- The caller's transaction commits synchronously whatever its session says; the
       -- session's process, so a wait of its commit can be cancelled alone.
       set_config('synchronous_commit', 'on', true) AS durable,
       pg_backend_pid() AS pid
FROM {schema}.runs r,
     LATERAL (SELECT greatest($2::bigint, least($3::bigint, coalesce(
         ceil(extract(epoch FROM r.lease_expires_at - now()) * 1000)::bigint, 0)))) AS b(ms)
WHERE r.run_id = $1
FOR UPDATE OF r
