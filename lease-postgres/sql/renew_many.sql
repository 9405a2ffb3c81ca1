-- $1 run_ids (text[]), $2 fences (bigint[]), $3 ttl_ms (bigint[]); run ids are distinct
-- Returns: one row per input, in input order: the new expiry if renewed, else the row the
-- refusal is judged against (no run when run_exists is false).
WITH input AS (
    SELECT i.run_id, i.fence, i.ttl_ms, i.ord
    FROM unnest($1::text[], $2::bigint[], $3::bigint[]) WITH ORDINALITY AS i(run_id, fence, ttl_ms, ord)
), renewed AS (
    UPDATE {schema}.runs r
    SET lease_expires_at = now() + input.ttl_ms * interval '1 millisecond',
        claimable_at = now() + input.ttl_ms * interval '1 millisecond',
        heartbeats = r.heartbeats + 1
    FROM input
    WHERE r.run_id = input.run_id COLLATE "C"
      AND r.fence = input.fence
      AND r.state = 'runnable'
      AND r.lease_owner IS NOT NULL
    RETURNING r.run_id, r.lease_expires_at
)
SELECT input.ord,
       (extract(epoch FROM renewed.lease_expires_at) * 1000000)::bigint AS expires_us,
       cur.run_id IS NOT NULL AS run_exists,
       cur.state, cur.lease_owner, cur.fence
FROM input
LEFT JOIN renewed ON renewed.run_id = input.run_id COLLATE "C"
LEFT JOIN {schema}.runs cur ON cur.run_id = input.run_id COLLATE "C"
ORDER BY input.ord
