-- $1 run_ids (text[]), $2 start delays in ms (bigint[], one per id; 0: claimable at once),
-- $3 payloads (bytea[], one per id; NULL: none), $4 kinds (text[], one per id), $5 run_at
-- times (bigint[] of µs since the Unix epoch, one per id; NULL: none; the later of it and the
-- delay's end holds, on the database clock), $6 priorities (smallint[], one per id)
-- Returns: the ordinal (from 1) of each input that created its run; every other input names a
-- run that existed, or repeats an id earlier in the batch. The new runs take created_seq (the
-- claim order's tie-breaker) in input order: the rows are inserted, and their identity drawn,
-- in the order of the first copy of each id.
-- Each run starts at the schema's fence floor, as in create.sql (which says why a floor read
-- in the statement's snapshot is enough). The transaction commits synchronously whatever the
-- session says.
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
), created AS (
    INSERT INTO {schema}.runs (run_id, fence, claimable_at, kind, priority)
    SELECT first.run_id, (SELECT f.fence FROM {schema}.fence_floor f), first.claimable_at,
           first.kind, first.priority
    FROM first
    ORDER BY first.ord
    ON CONFLICT (run_id) DO NOTHING
    RETURNING run_id
), stored AS (
    -- Each created run's payload (the first copy's, as for its delay).
    INSERT INTO {schema}.run_payloads (run_id, payload)
    SELECT first.run_id, first.payload
    FROM first
    WHERE first.payload IS NOT NULL
      AND first.run_id IN (SELECT created.run_id FROM created)
    ON CONFLICT (run_id) DO UPDATE SET payload = excluded.payload
)
SELECT min(part.ord) AS ord
FROM (
    SELECT input.run_id, input.ord, false AS created FROM input
    UNION ALL
    SELECT created.run_id, NULL, true FROM created
) AS part
GROUP BY part.run_id
HAVING bool_or(part.created)
ORDER BY 1
