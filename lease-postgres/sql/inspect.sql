-- $1 run_id
-- Returns: the record, or no row if the run does not exist, with
-- its attempt history as one array per field, oldest first (null: none).
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
       wait_name, (extract(epoch FROM wait_deadline) * 1000000)::bigint AS wait_deadline_us, wait_fence,
       resumed_name, resumed_fence, (extract(epoch FROM resumed_at) * 1000000)::bigint AS resumed_at_us,
       resumed_payload,
       (SELECT p.payload FROM {schema}.run_payloads p WHERE p.run_id = $1) AS payload,
       (SELECT p.trace_parent FROM {schema}.run_payloads p WHERE p.run_id = $1) AS trace_parent,
       h_attempt, h_fence, h_worker, h_claimed_us, h_ended_us, h_outcome, h_error
FROM {schema}.runs r, LATERAL (
    SELECT array_agg((a.e->>'n')::bigint ORDER BY a.i) AS h_attempt,
           array_agg((a.e->>'f')::bigint ORDER BY a.i) AS h_fence,
           array_agg(a.e->>'w' ORDER BY a.i) AS h_worker,
           array_agg((a.e->>'c')::bigint ORDER BY a.i) AS h_claimed_us,
           array_agg((a.e->>'e')::bigint ORDER BY a.i) AS h_ended_us,
           array_agg(a.e->>'o' ORDER BY a.i) AS h_outcome,
           array_agg(a.e->>'r' ORDER BY a.i) AS h_error
    FROM jsonb_array_elements(r.history) WITH ORDINALITY AS a(e, i)) AS h
WHERE r.run_id = $1
