-- $1 run_ids (text[]), $2 fences (bigint[]), $3 ttl_ms (bigint[]); run ids are distinct
-- Returns: one row per input, in input order (ord). Rows locked by another transaction are
-- skipped, never waited for (locked = false, run_exists says whether the run is there); for the
-- others, the new expiry if renewed, else the row (read under our lock) the refusal is judged
-- against. Changes no indexed column (claimable_at only moves back, and only if a renewal
-- brings the expiry before it: see renew.sql), so each renewal can be a HOT update.
-- Linear in the batch under any plan: the row lookups go by primary key, and the per-input
-- answer is assembled by grouping on the ordinal, not by joining the CTEs (a generic plan
-- estimates an unnest of a parameter at 10 rows and would nest-loop such joins: quadratic).
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
        claimable_at = least(r.claimable_at, now() + locked.ttl_ms * interval '1 millisecond'),
        heartbeats = r.heartbeats + 1
    FROM locked
    WHERE r.run_id = locked.run_id
      AND r.fence = locked.presented
      AND r.state = 'runnable'
      AND r.lease_owner IS NOT NULL
    RETURNING locked.ord, r.lease_expires_at
)
SELECT part.ord,
       max(part.expires_us) AS expires_us,
       bool_or(part.locked) AS locked,
       bool_or(part.run_exists) AS run_exists,
       max(part.state) AS state,
       max(part.lease_owner) AS lease_owner,
       max(part.fence) AS fence
FROM (
    -- Existence only (a skipped row is not read); no lock, so this never waits.
    SELECT input.ord, NULL::bigint AS expires_us, false AS locked,
           EXISTS (SELECT 1 FROM {schema}.runs cur
                   WHERE cur.run_id = input.run_id COLLATE "C") AS run_exists,
           NULL::text AS state, NULL::text AS lease_owner, NULL::bigint AS fence
    FROM input
    UNION ALL
    SELECT locked.ord, NULL, true, true, locked.state, locked.lease_owner, locked.fence
    FROM locked
    UNION ALL
    SELECT renewed.ord, (extract(epoch FROM renewed.lease_expires_at) * 1000000)::bigint,
           true, true, NULL, NULL, NULL
    FROM renewed
) AS part
GROUP BY part.ord
ORDER BY part.ord
