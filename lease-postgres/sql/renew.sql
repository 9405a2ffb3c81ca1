-- $1 run_id, $2 fence, $3 ttl_ms
-- Returns: the new expiry, or no row when the fenced write is refused.
-- Changes no indexed column, so the heartbeat can be a HOT update (no new index entry; the
-- table's fillfactor keeps room on the page). claimable_at, the claim-order index key, keeps the
-- expiry of the claim (claim_next skips such a lagging entry while the lease is held, and moves
-- it forward): least() leaves it as it is unless this renewal brings the expiry before it (a
-- lease renewed with a shorter TTL than before), so claimable_at <= lease_expires_at holds for
-- every held run and an expired run is always within claim_next's reach.
UPDATE {schema}.runs
SET lease_expires_at = now() + $3::bigint * interval '1 millisecond',
    claimable_at = least(claimable_at, now() + $3::bigint * interval '1 millisecond'),
    heartbeats = heartbeats + 1,
    renewed_at = now()
WHERE run_id = $1 AND fence = $2 AND state = 'runnable' AND lease_owner IS NOT NULL
RETURNING (extract(epoch FROM lease_expires_at) * 1000000)::bigint AS expires_us
