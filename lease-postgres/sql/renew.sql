-- $1 run_id, $2 fence, $3 ttl_ms
-- Returns: the new expiry, or no row when the fenced write is refused.
UPDATE {schema}.runs
SET lease_expires_at = now() + $3::bigint * interval '1 millisecond',
    claimable_at = now() + $3::bigint * interval '1 millisecond',
    heartbeats = heartbeats + 1
WHERE run_id = $1 AND fence = $2 AND state = 'runnable' AND lease_owner IS NOT NULL
RETURNING (extract(epoch FROM lease_expires_at) * 1000000)::bigint AS expires_us
