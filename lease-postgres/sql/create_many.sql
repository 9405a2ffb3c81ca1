-- $1 run_ids (text[]), $2 start delays in ms (bigint[], one per id; 0: claimable at once),
-- $3 payloads (bytea[], one per id; NULL: none), $4 kinds (text[], one per id), $5 run_at
-- times (bigint[] of µs since the Unix epoch, one per id; NULL: none; the later of it and the
-- delay's end holds, on the database clock), $6 priorities (smallint[], one per id), $7
-- unique keys (text[], one per id; NULL: none), $8 queues (text[], one per id), $9 trace
-- parents (text[], one per id; NULL: none)
-- Returns: the ordinal (from 1) of each input that created its run; every other input names a
-- run that existed, repeats an id earlier in the batch, or has a unique key a live run holds
-- or an earlier input of the batch took (sql/unique_holders.sql tells which). The new runs take created_seq (the
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
           i.payload, i.kind, i.priority, i.unique_key COLLATE "C" AS unique_key, i.queue,
           i.trace_parent, i.ord
    FROM unnest($1::text[], $2::bigint[], $3::bytea[], $4::text[], $5::bigint[], $6::smallint[],
                $7::text[], $8::text[], $9::text[])
         WITH ORDINALITY AS i(run_id, delay_ms, payload, kind, run_at_us, priority, unique_key, queue,
                              trace_parent, ord)
    -- Volatile, so evaluated (per row) and never folded away.
    WHERE set_config('synchronous_commit', 'on', true) IS NOT NULL
), first_ids AS (
    SELECT DISTINCT ON (input.run_id) input.run_id, input.claimable_at, input.payload, input.kind, input.priority, input.unique_key, input.queue, input.trace_parent, input.ord
    FROM input
    ORDER BY input.run_id, input.ord
), first AS (
    -- The first copy of each id, and of those the first to ask for each unique key.
    SELECT ranked.run_id, ranked.claimable_at, ranked.payload, ranked.kind, ranked.priority,
           ranked.unique_key, ranked.queue, ranked.trace_parent, ranked.ord
    FROM (SELECT first_ids.*,
                 row_number() OVER (PARTITION BY first_ids.unique_key ORDER BY first_ids.ord)
                     AS key_rank
          FROM first_ids) AS ranked
    WHERE ranked.unique_key IS NULL OR ranked.key_rank = 1
), created AS (
    -- created_at written, as in create.sql.
    INSERT INTO {schema}.runs (run_id, fence, claimable_at, kind, priority, unique_key, queue,
                               created_at)
    SELECT first.run_id, (SELECT f.fence FROM {schema}.fence_floor f), first.claimable_at,
           first.kind, first.priority, first.unique_key, first.queue, now()
    FROM first
    ORDER BY first.ord
    -- No conflict target: an id that exists and a unique key a live run holds both make the
    -- input create nothing.
    ON CONFLICT DO NOTHING
    RETURNING run_id
), stored AS (
    -- Each created run's payload and trace parent (the first copy's, as for its delay).
    INSERT INTO {schema}.run_payloads (run_id, payload, trace_parent)
    SELECT first.run_id, first.payload, first.trace_parent
    FROM first
    WHERE (first.payload IS NOT NULL OR first.trace_parent IS NOT NULL)
      AND first.run_id IN (SELECT created.run_id FROM created)
    ON CONFLICT (run_id) DO UPDATE SET payload = excluded.payload,
                                       trace_parent = excluded.trace_parent
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
