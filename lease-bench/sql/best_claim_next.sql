-- The best single statement for claiming the next runs, for `lease-bench --parts best`.
-- $1 worker_id, $2 ttl_ms, $3 max
-- Returns: the claimed runs and their fences, in no particular order.
-- The textbook queue pick: oldest claimable first through runs_claimable, SKIP LOCKED, one
-- UPDATE. It keeps claimable_at = expiry (without that, held runs would pile up at the head of
-- the index). Against lease-postgres/sql/claim_next.sql it leaves out moving lagging entries
-- (runs renewed past their claim's expiry), the answer's order and the expiries, and claims
-- from the default kind at priority 0 only (the runs the bench creates): the equalities lead
-- runs_claimable (kind, priority, queue, claimable_at, created_seq), so the pick walks the index in
-- order. Without them (as it read before kinds and priorities led the index) it sorted every
-- claimable run on each call and ran at a third of the library's rate.
UPDATE {schema}.runs
SET lease_owner = $1,
    lease_expires_at = now() + $2::bigint * interval '1 millisecond',
    claimable_at = now() + $2::bigint * interval '1 millisecond',
    fence = fence + 1
WHERE run_id IN (
    SELECT run_id
    FROM {schema}.runs
    WHERE state = 'runnable'
      AND kind = 'default'
      AND priority = 0
      AND queue = 'default'
      AND claimable_at <= now()
      AND (lease_owner IS NULL OR lease_expires_at <= now())
    ORDER BY kind, priority, queue, claimable_at, created_seq
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
RETURNING run_id, fence
