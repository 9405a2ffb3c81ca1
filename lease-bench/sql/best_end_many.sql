-- The best single statement for completing a batch with an effect each, for
-- `lease-bench --parts best`: one data-modifying CTE that completes the runs and journals the
-- payloads under their fences.
-- $1 run_ids (text[]), $2 fences (bigint[]), $3 payloads (bytea[])
-- Returns: nothing; one journal row inserted per completed run.
-- Against lease-postgres/sql/end_many.sql it leaves out SKIP LOCKED (it waits behind a locked
-- row), other end kinds, claimable_at, and the per-input answer (refusal reasons).
WITH ended AS (
    UPDATE {schema}.runs r
    SET state = 'completed',
        lease_owner = NULL,
        lease_expires_at = NULL,
        journal_len = r.journal_len + 1
    FROM unnest($1::text[], $2::bigint[], $3::bytea[]) AS i(run_id, fence, payload)
    WHERE r.run_id = i.run_id COLLATE "C"
      AND r.fence = i.fence
      AND r.state = 'runnable'
      AND r.lease_owner IS NOT NULL
    RETURNING r.run_id, r.fence, r.journal_len, i.payload
)
INSERT INTO {schema}.journal (run_id, seq, fence, payload, written_at)
SELECT ended.run_id, ended.journal_len, ended.fence, ended.payload, now()
FROM ended
