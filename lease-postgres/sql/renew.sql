-- $1 run_id, $2 fence, $3 ttl_ms
-- Returns: the new expiry, or no row when the fenced write is refused.
-- Writes no indexed column, so the heartbeat can be a HOT update (no index entry, room kept by
-- the table's fillfactor). claimable_at, the claim-order index key, keeps the expiry of the
-- claim: claim_next skips such a lagging entry while the lease is held and moves it forward.
UPDATE {schema}.runs
SET lease_expires_at = now() + $3::bigint * interval '1 millisecond',
    heartbeats = heartbeats + 1
WHERE run_id = $1 AND fence = $2 AND state = 'runnable' AND lease_owner IS NOT NULL
RETURNING (extract(epoch FROM lease_expires_at) * 1000000)::bigint AS expires_us
