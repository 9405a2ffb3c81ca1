-- $1 run_ids (text[]), $2 fences (bigint[]), $3 new states (text[]: 'completed', 'runnable' to
-- release, 'suspended', 'failed'), $4 payloads (bytea[]: a complete-with's journal entry, else
-- null), $5 delays (bigint[]: ms before a released run is claimable, else 0), $6 failure reasons
-- (text[]: a fail's, else null), $7 refunds (bool[]: the end is voluntary, a release, a
-- suspend or a snooze, and gives the attempt back), $8 outcomes (text[]: the attempt's end as
-- the history names it), $9 errors (text[]: the error the history keeps, or null), $10 wait
-- names (text[]: an await-signal's signal, else null), $11 wait timeouts (bigint[]: its ms, null
-- for none); run ids are distinct. A wait records its name, deadline and the lease's fence, and
-- forgets how the run's last wait ended; unless a signal for its name came while the lease held
-- the run (sql/signal.sql keeps it under the lease's fence): then the wait is answered as it
-- begins, and the run is runnable, claimable now, with the signal and a fresh budget.
-- Returns: one row per input, in input order (ord). Rows locked by another transaction are
-- skipped, never waited for (locked = false; run_exists says whether the run is there). For the
-- others, ended = true if the lease was ended (and a payload journaled under its fence, in the
-- same statement: both or neither), else the row, read under our lock, that the refusal is judged
-- against.
-- Linear in the batch under any plan: the row lookups go by primary key, and the per-input
-- answer is assembled by grouping on the ordinal, not by joining the CTEs (a generic plan
-- estimates an unnest of a parameter at 10 rows and would nest-loop such joins: quadratic).
WITH input AS (
    SELECT i.run_id, i.fence, i.to_state, i.payload, i.delay_ms, i.failure, i.refund,
           i.outcome, i.error, i.wait_name, i.wait_ms, i.ord
    FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bytea[], $5::bigint[], $6::text[],
                $7::bool[], $8::text[], $9::text[], $10::text[], $11::bigint[])
         WITH ORDINALITY AS i(run_id, fence, to_state, payload, delay_ms, failure, refund,
                              outcome, error, wait_name, wait_ms, ord)
    -- The transaction commits synchronously whatever the session says (end_in runs this
    -- inside the caller's transaction). Volatile, so evaluated per row, never folded away.
    WHERE set_config('synchronous_commit', 'on', true) IS NOT NULL
), locked AS (
    SELECT input.ord, input.fence AS presented,
           -- A wait answered early is no wait: the run is given back as a release gives it.
           CASE WHEN early.answered THEN 'runnable' ELSE input.to_state END AS to_state,
           input.payload, input.delay_ms,
           input.failure, input.refund, input.outcome, input.error,
           CASE WHEN early.answered THEN NULL ELSE input.wait_name END AS wait_name,
           input.wait_ms, input.wait_name IS NOT NULL AS waits, r.run_id, r.state,
           r.lease_owner, r.fence
    FROM input
    JOIN {schema}.runs r ON r.run_id = input.run_id COLLATE "C"
    -- Whether sql/signal.sql kept a signal for this wait while the lease held the run.
    CROSS JOIN LATERAL (
        SELECT coalesce(input.wait_name IS NOT NULL AND r.resumed_fence = r.fence
                        AND r.resumed_name = input.wait_name
                        AND r.resumed_payload IS NOT NULL, false) AS answered
    ) AS early
    FOR UPDATE OF r SKIP LOCKED
), ended AS (
    UPDATE {schema}.runs r
    SET state = locked.to_state,
        lease_owner = NULL,
        lease_expires_at = NULL,
        -- For a completed or failed run, when it ended; for a timed wait, its deadline.
        claimable_at = now() + CASE WHEN locked.wait_name IS NULL THEN locked.delay_ms
                                    ELSE coalesce(locked.wait_ms, 0) END * interval '1 millisecond',
        wait_name = locked.wait_name,
        wait_fence = CASE WHEN locked.wait_name IS NULL THEN NULL ELSE r.fence END,
        wait_deadline = CASE WHEN locked.wait_name IS NULL THEN NULL
                             ELSE now() + locked.wait_ms * interval '1 millisecond' END,
        resumed_name = CASE WHEN locked.wait_name IS NULL THEN r.resumed_name END,
        resumed_fence = CASE WHEN locked.wait_name IS NULL THEN r.resumed_fence END,
        resumed_at = CASE WHEN locked.wait_name IS NULL THEN r.resumed_at END,
        resumed_payload = CASE WHEN locked.wait_name IS NULL THEN r.resumed_payload END,
        failure = locked.failure,
        attempts = CASE WHEN locked.waits AND locked.wait_name IS NULL THEN 0
                        WHEN locked.refund THEN greatest(r.attempts - 1, 0) ELSE r.attempts END,
        journal_len = r.journal_len + CASE WHEN locked.payload IS NULL THEN 0 ELSE 1 END,
        -- The attempt's end, numbered before any refund (the SET reads the old row).
        history = {schema}.attempt_pushed(r.history, {max_history},
                                          r.attempts, r.fence, r.lease_owner,
                                          r.claimed_at, now(), locked.outcome, locked.error)
    FROM locked
    -- The verdict is judged on the row as `locked` read it under our lock, which holds until
    -- the commit: nothing else changes it in between. Judged on r's columns instead, the
    -- conditions matched runs_held's predicate, and a generic plan found the rows through that
    -- index, hashing every held lease of the schema on every call (O(held), not O(batch)).
    WHERE r.run_id = locked.run_id
      AND locked.fence = locked.presented
      AND locked.state = 'runnable'
      AND locked.lease_owner IS NOT NULL
    RETURNING locked.ord, r.run_id, r.fence, r.journal_len, locked.payload
), journaled AS (
    -- Only the ends that were applied. The row lock makes seq gapless, as in append.sql.
    INSERT INTO {schema}.journal (run_id, seq, fence, payload, written_at)
    SELECT ended.run_id, ended.journal_len, ended.fence, ended.payload, now()
    FROM ended
    WHERE ended.payload IS NOT NULL
)
SELECT part.ord,
       bool_or(part.ended) AS ended,
       bool_or(part.locked) AS locked,
       -- Existence is read only for an item whose row was not locked (a skipped row is not
       -- read); no lock, so this never waits. A locked row exists.
       CASE WHEN bool_or(part.locked) THEN true
            ELSE EXISTS (SELECT 1 FROM {schema}.runs cur
                         WHERE cur.run_id = max(part.run_id) COLLATE "C") END AS run_exists,
       max(part.state) AS state,
       max(part.lease_owner) AS lease_owner,
       max(part.fence) AS fence
FROM (
    SELECT input.ord, false AS ended, false AS locked, input.run_id,
           NULL::text AS state, NULL::text AS lease_owner, NULL::bigint AS fence
    FROM input
    UNION ALL
    SELECT locked.ord, false, true, NULL, locked.state, locked.lease_owner, locked.fence
    FROM locked
    UNION ALL
    SELECT ended.ord, true, true, NULL, NULL, NULL, NULL
    FROM ended
) AS part
GROUP BY part.ord
ORDER BY part.ord
