-- $1 run_ids (text[]), $2 fences (bigint[]), $3 ttl_ms (bigint[]); run ids are distinct
-- Returns: one row per input, in input order (ord). Rows locked by another transaction are
-- skipped, never waited for (locked = false, run_exists says whether the run is there); for the
-- others, the new expiry if renewed, else the row (read under our lock) the refusal is judged
-- against. Every join is on the input's ordinal or the primary key (hash or merge joins, or
-- index lookups on a large table): no nested loop over the batch.
WITH input AS (
    SELECT i.run_id, i.fence, i.ttl_ms, i.ord
    FROM unnest($1::text[], $2::bigint[], $3::bigint[]) WITH ORDINALITY AS i(run_id, fence, ttl_ms, ord)
), locked AS (
    SELECT input.ord, input.fence AS presented, input.ttl_ms,
           r.run_id, r.state, r.lease_owner, r.fence
    FROM input
    JOIN {schema}.runs r ON r.run_id = input.run_id COLLATE "C"
    FOR UPDATE OF r SKIP LOCKED
), renewed AS (
    UPDATE {schema}.runs r
    SET lease_expires_at = now() + locked.ttl_ms * interval '1 millisecond',
        claimable_at = now() + locked.ttl_ms * interval '1 millisecond',
        heartbeats = r.heartbeats + 1
    FROM locked
    WHERE r.run_id = locked.run_id
      AND r.fence = locked.presented
      AND r.state = 'runnable'
      AND r.lease_owner IS NOT NULL
    RETURNING locked.ord, r.lease_expires_at
)
SELECT input.ord,
       (extract(epoch FROM renewed.lease_expires_at) * 1000000)::bigint AS expires_us,
       locked.ord IS NOT NULL AS locked,
       cur.run_id IS NOT NULL AS run_exists,
       locked.state, locked.lease_owner, locked.fence
FROM input
LEFT JOIN locked ON locked.ord = input.ord
LEFT JOIN renewed ON renewed.ord = input.ord
-- Existence only (a skipped row is not read); no lock, so this never waits.
LEFT JOIN {schema}.runs cur ON cur.run_id = input.run_id COLLATE "C"
ORDER BY input.ord
