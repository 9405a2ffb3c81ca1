-- $1 run_id, $2 fence, $3 payload
-- Returns: the new journal entry, or no row when the fenced write is refused. The run row's
-- lock makes seq gapless per run.
WITH run AS (
    UPDATE {schema}.runs
    SET journal_len = journal_len + 1
    WHERE run_id = $1 AND fence = $2 AND state = 'runnable' AND lease_owner IS NOT NULL
    RETURNING run_id, journal_len, fence
)
INSERT INTO {schema}.journal (run_id, seq, fence, payload, written_at)
SELECT run_id, journal_len, fence, $3, now() FROM run
RETURNING seq, fence, (extract(epoch FROM written_at) * 1000000)::bigint AS written_us
