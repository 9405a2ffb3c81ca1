-- $1 run_ids (text[]), $2 start delays in ms (bigint[], one per id; 0: claimable at once),
-- $3 payloads (bytea[], one per id; NULL: none), $4 kinds (text[], one per id), $5 run_at
-- times (bigint[] of µs since the Unix epoch, one per id; NULL: none; the later of it and the
-- delay's end holds, on the database clock), $6 priorities (smallint[], one per id)
-- Returns: the ordinal (from 1) of each input that created its run; every other input names a
-- run that existed, or repeats an id earlier in the batch. The new runs take created_seq (the
-- claim order's tie-breaker) in input order: the rows are inserted, and their identity drawn,
-- in the order of the first copy of each id.
-- A purged id is revived in its row, at its last fence, as in create.sql (a serialization
-- failure under REPEATABLE READ when the purge committed after the snapshot); it takes a new
-- created_seq too. The transaction commits synchronously whatever the session says.
-- Linear in the batch: the answer is assembled by grouping on the id, not by joining the CTEs.
WITH input AS (
    SELECT i.run_id COLLATE "C" AS run_id,
           greatest(now() + i.delay_ms * interval '1 millisecond',
                    'epoch'::timestamptz + i.run_at_us * interval '1 microsecond') AS claimable_at,
           i.payload, i.kind, i.priority, i.ord
    FROM unnest($1::text[], $2::bigint[], $3::bytea[], $4::text[], $5::bigint[], $6::smallint[])
         WITH ORDINALITY AS i(run_id, delay_ms, payload, kind, run_at_us, priority, ord)
    -- Volatile, so evaluated (per row) and never folded away.
    WHERE set_config('synchronous_commit', 'on', true) IS NOT NULL
), first AS (
    SELECT DISTINCT ON (input.run_id) input.run_id, input.claimable_at, input.payload, input.kind, input.priority, input.ord
    FROM input
    ORDER BY input.run_id, input.ord
), revived AS (
    UPDATE {schema}.runs r
    SET state = 'runnable', lease_owner = NULL, lease_expires_at = NULL, heartbeats = 0,
        created_at = now(), claimed_at = NULL, renewed_at = NULL,
        claimable_at = first.claimable_at, journal_len = 0,
        failure = NULL, attempts = 0, history = '[]', created_seq = DEFAULT, kind = first.kind,
        priority = first.priority
    FROM first
    WHERE r.run_id = first.run_id AND r.state = 'purged'
    RETURNING r.run_id
), created AS (
    -- The revived ids conflict with their own rows and are skipped.
    INSERT INTO {schema}.runs (run_id, claimable_at, kind, priority)
    SELECT first.run_id, first.claimable_at, first.kind, first.priority
    FROM first
    ORDER BY first.ord
    ON CONFLICT (run_id) DO NOTHING
    RETURNING run_id
), stored AS (
    -- Each created or revived run's payload (the first copy's, as for its delay).
    INSERT INTO {schema}.run_payloads (run_id, payload)
    SELECT first.run_id, first.payload
    FROM first
    WHERE first.payload IS NOT NULL
      AND first.run_id IN (SELECT created.run_id FROM created UNION ALL SELECT revived.run_id FROM revived)
    ON CONFLICT (run_id) DO UPDATE SET payload = excluded.payload
)
SELECT min(part.ord) AS ord
FROM (
    SELECT input.run_id, input.ord, false AS created FROM input
    UNION ALL
    SELECT created.run_id, NULL, true FROM created
    UNION ALL
    SELECT revived.run_id, NULL, true FROM revived
) AS part
GROUP BY part.run_id
HAVING bool_or(part.created)
ORDER BY 1
