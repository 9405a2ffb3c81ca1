-- $1 run_id, $2 reason, $3 the reason as a history entry keeps it (lease_core::attempt_error)
-- Returns: the cancelled record, or no row if the run is missing, completed, or
-- already cancelled. A holder is fenced out: the fence stays, the state is no longer
-- 'runnable', so its fenced writes, ends and renewals match nothing and are explained as
-- cancelled. A row a caller's transaction locked (end_in, fence_in) is cancelled after that
-- transaction ends, and then only if it did not complete the run.
UPDATE {schema}.runs
SET state = 'cancelled', lease_owner = NULL, lease_expires_at = NULL, failure = $2,
    wait_name = NULL, wait_fence = NULL, wait_deadline = NULL,
    claimable_at = now(),
    -- A held lease's attempt ends cancelled, with the reason; one that had already expired
    -- ended at its expiry.
    history = CASE WHEN lease_owner IS NULL THEN history
                   WHEN lease_expires_at <= now()
                   THEN {schema}.attempt_pushed(history, {max_history},
                                                attempts, fence, lease_owner, claimed_at,
                                                lease_expires_at, 'expired', NULL)
                   ELSE {schema}.attempt_pushed(history, {max_history},
                                                attempts, fence, lease_owner, claimed_at,
                                                now(), 'cancelled', $3) END
WHERE run_id = $1 AND state IN ('runnable', 'suspended', 'failed')
RETURNING run_id, state, lease_owner, (extract(epoch FROM lease_expires_at) * 1000000)::bigint AS expires_us, fence, heartbeats, (extract(epoch FROM now()) * 1000000)::bigint AS observed_us,
       NULL::bigint AS not_before_us, (extract(epoch FROM created_at) * 1000000)::bigint AS created_us,
       (extract(epoch FROM claimed_at) * 1000000)::bigint AS claimed_us,
       (extract(epoch FROM renewed_at) * 1000000)::bigint AS renewed_us,
       CASE WHEN state IN ('completed', 'failed', 'cancelled')
            THEN (extract(epoch FROM claimable_at) * 1000000)::bigint END AS ended_us,
       failure, attempts, kind, queue, priority
