-- $1 worker_id, $2 ttl_ms, $3 max
-- Returns: the claimed runs with their fences and expiries, those claimable longest first.
WITH picked AS (
    SELECT run_id, claimable_at AS was_claimable_at, created_seq
    FROM {schema}.runs
    WHERE state = 'runnable'
      AND claimable_at <= now()
      AND fence < 9223372036854775807
    ORDER BY claimable_at, created_seq
    LIMIT $3
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE {schema}.runs r
    SET lease_owner = $1,
        lease_expires_at = now() + $2::bigint * interval '1 millisecond',
        claimable_at = now() + $2::bigint * interval '1 millisecond',
        fence = r.fence + 1
    FROM picked
    WHERE r.run_id = picked.run_id
    RETURNING r.run_id, r.fence, r.lease_expires_at
)
SELECT claimed.run_id, claimed.fence,
       (extract(epoch FROM claimed.lease_expires_at) * 1000000)::bigint AS expires_us
FROM claimed JOIN picked USING (run_id)
ORDER BY picked.was_claimable_at, picked.created_seq
