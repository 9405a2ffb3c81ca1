-- $1 run_ids (text[])
-- Returns: the ordinal (from 1) of each input that created its run; every other input names a
-- run that existed, or repeats an id earlier in the batch. The new runs take created_seq (the
-- claim order's tie-breaker) in input order: the rows are inserted, and their identity drawn,
-- in the order of the first copy of each id.
-- Linear in the batch: the answer is assembled by grouping on the id, not by joining the CTEs.
WITH input AS (
    SELECT i.run_id COLLATE "C" AS run_id, i.ord
    FROM unnest($1::text[]) WITH ORDINALITY AS i(run_id, ord)
), created AS (
    -- A purged id starts at its tombstone's fence.
    INSERT INTO {schema}.runs (run_id, fence)
    SELECT first.run_id, coalesce(t.fence, 0)
    FROM (SELECT DISTINCT ON (input.run_id) input.run_id, input.ord
          FROM input
          ORDER BY input.run_id, input.ord) AS first
    LEFT JOIN {schema}.tombstones t ON t.run_id = first.run_id
    ORDER BY first.ord
    ON CONFLICT (run_id) DO NOTHING
    RETURNING run_id
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
