-- The best single statement for a heartbeat, for `lease-bench --parts best`.
-- $1 run_id, $2 fence, $3 ttl_ms
-- Returns: nothing; one row affected when renewed.
-- Writes no indexed column: a HOT update. Against lease-postgres/sql/renew.sql it leaves out the
-- state and owner checks, claimable_at's least() and the expiry in the answer.
UPDATE {schema}.runs
SET lease_expires_at = now() + $3::bigint * interval '1 millisecond',
    heartbeats = heartbeats + 1
WHERE run_id = $1 AND fence = $2
