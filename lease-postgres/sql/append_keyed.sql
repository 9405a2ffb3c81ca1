-- $1 run_id, $2 fence, $3 payload, $4 idempotency key
-- Returns: one row, the run's journal entry written with this key (applied = true if this call
-- wrote it, false for an earlier one, whose own payload is returned), or no row when refused:
-- the presented fence is not the run's, or the key is new and the lease is not held.
-- The run row is locked first, so keyed appends of one run are serialized; a concurrent call
-- with the same key that committed meanwhile is invisible to this statement's snapshot and
-- makes the insert fail on journal_idem_key (23505): the caller runs the statement again.
WITH cur AS (
    SELECT fence FROM {schema}.runs WHERE run_id = $1 FOR UPDATE
), existing AS (
    SELECT j.seq, j.fence, j.payload, j.written_at
    FROM {schema}.journal j, cur
    WHERE j.run_id = $1 AND j.idem_key = $4 AND cur.fence = $2
), run AS (
    UPDATE {schema}.runs r
    SET journal_len = r.journal_len + 1
    FROM cur
    WHERE r.run_id = $1 AND r.fence = $2 AND r.state = 'runnable' AND r.lease_owner IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM existing)
    RETURNING r.run_id, r.journal_len, r.fence
), written AS (
    INSERT INTO {schema}.journal (run_id, seq, fence, payload, written_at, idem_key)
    SELECT run_id, journal_len, fence, $3, now(), $4 FROM run
    RETURNING seq, fence, payload, written_at
)
SELECT seq, fence, payload, (extract(epoch FROM written_at) * 1000000)::bigint AS written_us,
       true AS applied
FROM written
UNION ALL
SELECT seq, fence, payload, (extract(epoch FROM written_at) * 1000000)::bigint, false
FROM existing
