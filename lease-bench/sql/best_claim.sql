-- The best single statement for a claim on the same table, for `lease-bench --parts best`.
-- $1 run_id, $2 worker_id, $3 ttl_ms
-- Returns: the new fence, or no row when the run is held or not runnable.
-- What it leaves out against lease-postgres/sql/claim.sql: claimable_at (the claim-order index
-- key, so it is a HOT update where claim.sql is not; a store claiming this way could not serve
-- claim_next from runs_claimable) and the expiry in the answer.
UPDATE {schema}.runs
SET lease_owner = $2,
    lease_expires_at = now() + $3::bigint * interval '1 millisecond',
    fence = fence + 1
WHERE run_id = $1
  AND state = 'runnable'
  AND (lease_owner IS NULL OR lease_expires_at <= now())
RETURNING fence
