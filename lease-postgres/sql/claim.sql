-- $1 run_id, $2 worker_id, $3 ttl_ms
-- Returns: the new fence, expiry, attempt count, payload, kind, queue and priority, or no row
-- when the claim is refused (explained by a read). Every claim counts against the attempt
-- budget; a voluntary end gives it back.
UPDATE {schema}.runs
SET lease_owner = $2,
    lease_expires_at = now() + $3::bigint * interval '1 millisecond',
    claimable_at = now() + $3::bigint * interval '1 millisecond',
    -- The first claim of a run's life starts above the fence floor (sql/create.sql says why
    -- the floor the run was created at may be below it).
    fence = CASE WHEN claimed_at IS NULL
                 THEN greatest(fence, (SELECT f.fence FROM {schema}.fence_floor f))
                 ELSE fence END + 1,
    attempts = attempts + 1,
    claimed_at = now(),
    renewed_at = NULL,
    -- An expired lease taken over: its attempt ended at its expiry (the SET reads the old row).
    history = CASE WHEN lease_owner IS NULL THEN history
                   ELSE {schema}.attempt_pushed(history, {max_history},
                                                attempts, fence, lease_owner, claimed_at,
                                                lease_expires_at, 'expired', NULL) END
WHERE run_id = $1
  AND state = 'runnable'
  AND (lease_owner IS NULL OR lease_expires_at <= now())
  -- An unowned run given back with a retry delay is not claimable before it ends.
  AND (lease_owner IS NOT NULL OR claimable_at <= now())
  AND CASE WHEN claimed_at IS NULL
           THEN greatest(fence, (SELECT f.fence FROM {schema}.fence_floor f))
           ELSE fence END < 9223372036854775807
RETURNING fence, (extract(epoch FROM lease_expires_at) * 1000000)::bigint AS expires_us, attempts, kind, queue, priority,
          (SELECT p.payload FROM {schema}.run_payloads p WHERE p.run_id = $1) AS payload
