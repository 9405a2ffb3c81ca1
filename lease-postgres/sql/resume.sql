-- $1 run_id
-- Returns: the resumed record, or no row if the run is missing or not suspended.
UPDATE {schema}.runs
SET state = 'runnable', claimable_at = now()
WHERE run_id = $1 AND state = 'suspended'
RETURNING run_id, state, lease_owner, (extract(epoch FROM lease_expires_at) * 1000000)::bigint AS expires_us, fence, heartbeats, (extract(epoch FROM now()) * 1000000)::bigint AS observed_us
