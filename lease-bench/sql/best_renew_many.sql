-- The best single statement for renewing a batch, for `lease-bench --parts best`.
-- $1 run_ids (text[]), $2 fences (bigint[]), $3 ttl_ms (one for the batch)
-- Returns: the ordinal (from 1) of each renewed input.
-- HOT updates (no indexed column written). Against lease-postgres/sql/renew_many.sql it leaves
-- out SKIP LOCKED (it waits behind a locked row), the per-input refusal reasons and expiries,
-- and the state and owner checks.
UPDATE {schema}.runs r
SET lease_expires_at = now() + $3::bigint * interval '1 millisecond',
    heartbeats = r.heartbeats + 1
FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY AS i(run_id, fence, ord)
WHERE r.run_id = i.run_id COLLATE "C" AND r.fence = i.fence
RETURNING i.ord
