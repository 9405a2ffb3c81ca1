-- $1 run_id
-- Returns: the new record, or no row if the run exists.
-- A purged id starts at its tombstone's fence.
INSERT INTO {schema}.runs (run_id, fence)
VALUES ($1, coalesce((SELECT t.fence FROM {schema}.tombstones t WHERE t.run_id = $1), 0))
ON CONFLICT (run_id) DO NOTHING
RETURNING run_id, state, lease_owner, (extract(epoch FROM lease_expires_at) * 1000000)::bigint AS expires_us, fence, heartbeats, (extract(epoch FROM now()) * 1000000)::bigint AS observed_us,
       CASE WHEN state = 'runnable' AND lease_owner IS NULL AND claimable_at > now()
            THEN (extract(epoch FROM claimable_at) * 1000000)::bigint END AS not_before_us,
       failure
