-- $1 run_id
-- Returns: the resumed record, or no row if the run is missing or neither suspended nor failed.
-- A resumed run starts a fresh attempt budget.
UPDATE {schema}.runs
SET state = 'runnable', claimable_at = now(), failure = NULL, attempts = 0
WHERE run_id = $1 AND state IN ('suspended', 'failed')
RETURNING run_id, state, lease_owner, (extract(epoch FROM lease_expires_at) * 1000000)::bigint AS expires_us, fence, heartbeats, (extract(epoch FROM now()) * 1000000)::bigint AS observed_us,
       CASE WHEN state = 'runnable' AND lease_owner IS NULL AND claimable_at > now()
            THEN (extract(epoch FROM claimable_at) * 1000000)::bigint END AS not_before_us,
       CASE WHEN state = 'runnable' AND lease_owner IS NULL AND claimable_at <= now()
            THEN (extract(epoch FROM claimable_at) * 1000000)::bigint END AS claimable_since_us,
       (extract(epoch FROM created_at) * 1000000)::bigint AS created_us,
       (extract(epoch FROM claimed_at) * 1000000)::bigint AS claimed_us,
       (extract(epoch FROM renewed_at) * 1000000)::bigint AS renewed_us,
       CASE WHEN state IN ('completed', 'failed', 'cancelled')
            THEN (extract(epoch FROM claimable_at) * 1000000)::bigint END AS ended_us,
       failure, attempts, kind, priority
