-- $1 run_ids (text[]), $2 fences (bigint[]), $3 ttl_ms (one for the statement); run ids are distinct
-- Returns: one row per renewed lease (run_id, expires_us), in no particular order; nothing for
-- the others (the caller explains those with renew_many_explain.sql). Rows locked by another
-- transaction are skipped, never waited for.
--
-- Changes no indexed column (claimable_at only moves back, and only if a renewal brings the
-- expiry before it: see renew.sql), so each renewal can be a HOT update.
--
-- Cost linear in the batch and flat in the table size under any plan, because no step leaves
-- the planner a join to choose (a generic plan estimates an unnest of a parameter at a handful
-- of rows and would nest-loop a join over the batch; a custom plan on a small table would hash
-- a scan of the whole table, or of runs_held):
-- 1. found: one primary-key probe per input, forced by LATERAL … OFFSET 0 (which cannot be
--    flattened into a join), keeping the rows that would renew (fence, state and owner as of
--    the statement's snapshot) and their tuple ids. The state and owner tests stay outside the
--    subquery (OFFSET 0 keeps them from being pushed into it): inside, they would imply the
--    runs_held predicate, and a planner whose statistics predate the claims (no held rows)
--    walks runs_held for each probe, a scan of every held lease per lease.
-- 2. locked: those tuples, fetched by tid and locked, SKIP LOCKED. A row updated since the
--    snapshot is locked in its new version, whose tid is not among the found ones.
-- 3. the update, by the locked tids. It sees only the versions the snapshot sees: a row that
--    changed since the probe (a new version) is not renewed, so a renewal always applies to
--    the exact version whose fence, state and owner passed in step 1, now locked by us.
WITH found AS (
    SELECT array_agg(f.tid) AS tids
    FROM unnest($1::text[], $2::bigint[]) AS i(run_id, fence)
    CROSS JOIN LATERAL (
        SELECT r.ctid AS tid, r.fence, r.state, r.lease_owner
        FROM {schema}.runs r
        WHERE r.run_id = i.run_id COLLATE "C"
        OFFSET 0
    ) AS f
    WHERE f.fence = i.fence
      AND f.state = 'runnable'
      AND f.lease_owner IS NOT NULL
), locked AS (
    SELECT r.ctid AS tid
    FROM {schema}.runs r
    WHERE r.ctid = ANY ((SELECT found.tids FROM found)::tid[])
    FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE {schema}.runs r
SET lease_expires_at = now() + $3::bigint * interval '1 millisecond',
    claimable_at = least(r.claimable_at, now() + $3::bigint * interval '1 millisecond'),
    heartbeats = r.heartbeats + 1,
    renewed_at = now()
WHERE r.ctid = ANY ((SELECT array_agg(locked.tid) FROM locked)::tid[])
RETURNING r.run_id,
          (SELECT (extract(epoch FROM now() + $3::bigint * interval '1 millisecond') * 1000000)::bigint)
              AS expires_us
