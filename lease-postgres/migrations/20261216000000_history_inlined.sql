-- attempt_pushed (migration 20261215000000) again, with the same result, written so that the
-- planner inlines it into the statements that call it: one expression, no subquery (the cap's
-- trim is a jsonpath slice instead of a sub-select), and STABLE, as jsonb_build_object and
-- extract over a timestamptz are. Called as a function (a call and its own executor per row)
-- it cost each ended lease about 10 µs more: end_many in batches of 125 on an idle server took
-- 57 µs per run, 46 µs with this (BENCHMARKS.md, "What a job costs the store").
--
-- history with one more attempt at its end, keeping the last `cap` (the oldest dropped).
CREATE OR REPLACE FUNCTION attempt_pushed(history JSONB, cap INT, n BIGINT, f BIGINT, w TEXT,
                                          c TIMESTAMPTZ, e TIMESTAMPTZ, o TEXT, r TEXT)
RETURNS JSONB
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT (CASE WHEN jsonb_array_length(history) < cap THEN history
                 ELSE jsonb_path_query_array(history, '$[$from to last]',
                          jsonb_build_object('from', jsonb_array_length(history) - cap + 1))
            END)
           || jsonb_build_array(jsonb_build_object(
                'n', n, 'f', f, 'w', w,
                'c', (extract(epoch FROM c) * 1000000)::bigint,
                'e', (extract(epoch FROM e) * 1000000)::bigint,
                'o', o, 'r', r))
$$;
