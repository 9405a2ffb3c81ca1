-- $1 run_id, $2 worker_id, $3 ttl_ms
-- Returns: the new fence, expiry, attempt count, payload, kind, queue and priority, or no row
-- when the claim is refused (explained by a read). Every claim counts against the attempt
-- budget; a voluntary end gives it back. A run waiting for a signal past its wait's deadline is
-- claimable: the claim ends the wait as timed out (resumed_*, a fresh budget) and takes it.
UPDATE {schema}.runs
SET state = 'runnable',
    lease_owner = $2,
    lease_expires_at = now() + $3::bigint * interval '1 millisecond',
    claimable_at = now() + $3::bigint * interval '1 millisecond',
    -- The first claim of a run's life starts above the fence floor (sql/create.sql says why
    -- the floor the run was created at may be below it).
    fence = CASE WHEN claimed_at IS NULL
                 THEN greatest(fence, (SELECT f.fence FROM {schema}.fence_floor f))
                 ELSE fence END + 1,
    attempts = CASE WHEN state = 'suspended' THEN 1 ELSE attempts + 1 END,
    resumed_name = CASE WHEN state = 'suspended' THEN wait_name ELSE resumed_name END,
    resumed_fence = CASE WHEN state = 'suspended' THEN wait_fence ELSE resumed_fence END,
    resumed_at = CASE WHEN state = 'suspended' THEN wait_deadline ELSE resumed_at END,
    resumed_payload = CASE WHEN state = 'suspended' THEN NULL ELSE resumed_payload END,
    wait_name = NULL, wait_fence = NULL, wait_deadline = NULL,
    claimed_at = now(),
    renewed_at = NULL,
    -- An expired lease taken over: its attempt ended at its expiry (the SET reads the old row).
    history = CASE WHEN lease_owner IS NULL THEN history
                   ELSE {schema}.attempt_pushed(history, {max_history},
                                                attempts, fence, lease_owner, claimed_at,
                                                lease_expires_at, 'expired', NULL) END
WHERE run_id = $1
  AND (state = 'runnable' OR (state = 'suspended' AND wait_deadline <= now()))
  AND (lease_owner IS NULL OR lease_expires_at <= now())
  -- An unowned run given back with a retry delay is not claimable before it ends.
  AND (lease_owner IS NOT NULL OR claimable_at <= now())
  AND CASE WHEN claimed_at IS NULL
           THEN greatest(fence, (SELECT f.fence FROM {schema}.fence_floor f))
           ELSE fence END < 9223372036854775807
RETURNING fence, (extract(epoch FROM lease_expires_at) * 1000000)::bigint AS expires_us, attempts, kind, queue, priority,
          resumed_name, resumed_fence, (extract(epoch FROM resumed_at) * 1000000)::bigint AS resumed_at_us,
          resumed_payload,
          (SELECT p.payload FROM {schema}.run_payloads p WHERE p.run_id = $1) AS payload,
          (SELECT p.trace_parent FROM {schema}.run_payloads p WHERE p.run_id = $1) AS trace_parent
