-- The attempt history (lease_core::RunRecord::history): each ended attempt of a run, oldest
-- first, the last 10 (lease_core::MAX_HISTORY), as a JSON array in the run's own row, so an
-- attempt's end is written by the same UPDATE that ends it, and a purge or a delete of the row
-- removes it. Each element: n (the attempt number), f (its fence), w (its worker), c and e (its
-- claim and its end, microseconds on the database clock), o (how it ended:
-- lease_core::AttemptOutcome's name) and r (its error, or null). Rows of runs from before this
-- migration start with no history. The default is a constant, so adding the column rewrites
-- nothing.
ALTER TABLE runs ADD COLUMN history JSONB NOT NULL DEFAULT '[]';

-- history with one more attempt at its end, the oldest dropped past 10.
CREATE FUNCTION attempt_pushed(history JSONB, n BIGINT, f BIGINT, w TEXT, c TIMESTAMPTZ,
                               e TIMESTAMPTZ, o TEXT, r TEXT) RETURNS JSONB
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (CASE WHEN jsonb_array_length(history) >= 10 THEN history - 0 ELSE history END)
           || jsonb_build_array(jsonb_build_object(
                'n', n, 'f', f, 'w', w,
                'c', (extract(epoch FROM c) * 1000000)::bigint,
                'e', (extract(epoch FROM e) * 1000000)::bigint,
                'o', o, 'r', r))
$$;
