-- $1 state (text or null), $2 expired only (bool), $3 after run_id (text or null), $4 limit,
-- $5 kind (text or null), $6 queue (text or null)
-- Returns: the matching records ordered by run_id.
SELECT run_id, state, lease_owner, (extract(epoch FROM lease_expires_at) * 1000000)::bigint AS expires_us, fence, heartbeats, (extract(epoch FROM now()) * 1000000)::bigint AS observed_us,
       CASE WHEN state = 'runnable' AND lease_owner IS NULL AND claimable_at > now()
            THEN (extract(epoch FROM claimable_at) * 1000000)::bigint END AS not_before_us,
       CASE WHEN state = 'runnable' AND lease_owner IS NULL AND claimable_at <= now()
            THEN (extract(epoch FROM claimable_at) * 1000000)::bigint END AS claimable_since_us,
       (extract(epoch FROM created_at) * 1000000)::bigint AS created_us,
       (extract(epoch FROM claimed_at) * 1000000)::bigint AS claimed_us,
       (extract(epoch FROM renewed_at) * 1000000)::bigint AS renewed_us,
       CASE WHEN state IN ('completed', 'failed', 'cancelled')
            THEN (extract(epoch FROM claimable_at) * 1000000)::bigint END AS ended_us,
       failure, attempts, kind, queue, priority,
       wait_name, (extract(epoch FROM wait_deadline) * 1000000)::bigint AS wait_deadline_us, wait_fence
FROM {schema}.runs
WHERE ($1::text IS NULL OR state = $1::text)
  AND (NOT $2::bool OR (lease_owner IS NOT NULL AND lease_expires_at <= now()))
  AND ($3::text IS NULL OR run_id > $3::text COLLATE "C")
  AND ($5::text IS NULL OR kind = $5::text)
  AND ($6::text IS NULL OR queue = $6::text)
ORDER BY run_id
LIMIT $4
