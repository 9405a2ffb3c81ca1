-- $1 run_id
-- Returns: the released record, or no row if the run is missing, suspended, completed or
-- failed. A retry delay ends: the run is claimable at once.
-- The fence is unchanged: the old holder's writes fail as released until the next claim.
-- A held lease's attempt goes into the history as force-released; one that had already expired
-- ended at its expiry.
UPDATE {schema}.runs
SET lease_owner = NULL, lease_expires_at = NULL, claimable_at = now(),
    history = CASE WHEN lease_owner IS NULL THEN history
                   WHEN lease_expires_at <= now()
                   THEN {schema}.attempt_pushed(history, {max_history},
                                                attempts, fence, lease_owner, claimed_at,
                                                lease_expires_at, 'expired', NULL)
                   ELSE {schema}.attempt_pushed(history, {max_history},
                                                attempts, fence, lease_owner, claimed_at,
                                                now(), 'force-released', NULL) END
WHERE run_id = $1 AND state = 'runnable'
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
