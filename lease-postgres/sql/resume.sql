-- $1 run_id
-- Returns: the resumed record, or no row if the run is missing or neither suspended nor failed.
-- A resumed run starts a fresh attempt budget. A failed run is live again: it takes its
-- unique key back unless another live run took the key meanwhile, in which case it gives the
-- key up (a suspended run is live already and holds its key).
UPDATE {schema}.runs AS r
SET state = 'runnable', claimable_at = now(), failure = NULL, attempts = 0,
    -- An operator's resume ends a wait unanswered.
    wait_name = NULL, wait_fence = NULL, wait_deadline = NULL,
    unique_key = CASE WHEN r.unique_key IS NOT NULL AND EXISTS (
                          SELECT 1 FROM {schema}.runs o
                          WHERE o.unique_key = r.unique_key AND o.run_id <> r.run_id
                            AND o.state IN ('runnable', 'suspended'))
                      THEN NULL ELSE r.unique_key END
WHERE r.run_id = $1 AND r.state IN ('suspended', 'failed')
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
       failure, attempts, kind, queue, priority
