-- $1 run_ids (text[], distinct), $2 floor_ms, $3 cap_ms
-- Returns: for each run of $1 that exists, its fence verdict inputs, locking
-- its row until the transaction ends; no row for the others. Rows are locked in run_id order, so
-- two such transactions never deadlock. In the same round trip it bounds the transaction, on the
-- server, by bound_ms = the least time left of the locked leases on the database clock, at least
-- floor_ms and at most cap_ms (lock_timeout, statement_timeout and
-- idle_in_transaction_session_timeout, transaction-local), and makes the transaction commit
-- synchronously, as lock_run.sql does for one run. The rows' own wait for these locks is bounded
-- by the session's lock_timeout.
WITH locked AS (
    SELECT r.run_id, r.state, r.lease_owner, r.fence, r.lease_expires_at
    FROM {schema}.runs r
    WHERE r.run_id = ANY($1::text[])
    ORDER BY r.run_id
    FOR UPDATE OF r
), bound AS (
    SELECT greatest($2::bigint, least($3::bigint, coalesce(
        min(ceil(extract(epoch FROM l.lease_expires_at - now()) * 1000)::bigint), 0))) AS ms
    FROM locked l
)
SELECT l.run_id, l.state, l.lease_owner, l.fence, b.ms AS bound_ms,
       set_config('idle_in_transaction_session_timeout', b.ms::text, true) AS idle_bound,
       set_config('statement_timeout', b.ms::text, true) AS statement_bound,
       set_config('lock_timeout', b.ms::text, true) AS lock_bound,
       set_config('synchronous_commit', 'on', true) AS durable,
       pg_backend_pid() AS pid
FROM locked l, bound b
