-- The attempt history's cap comes from the contract (lease_core::MAX_HISTORY): the statements
-- that push an attempt pass it, rendered into them as they are loaded, so no number of the
-- contract is spelled here. attempt_pushed without a cap (migration 20261210000000) stays for a
-- release still running the old statements during an upgrade.
--
-- history with one more attempt at its end, keeping the last `cap` (the oldest dropped).
CREATE FUNCTION attempt_pushed(history JSONB, cap INT, n BIGINT, f BIGINT, w TEXT,
                               c TIMESTAMPTZ, e TIMESTAMPTZ, o TEXT, r TEXT) RETURNS JSONB
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (CASE WHEN jsonb_array_length(history) < cap THEN history
                 ELSE (SELECT coalesce(jsonb_agg(x ORDER BY i), '[]'::jsonb)
                       FROM jsonb_array_elements(history) WITH ORDINALITY AS t(x, i)
                       WHERE i > jsonb_array_length(history) - cap + 1) END)
           || jsonb_build_array(jsonb_build_object(
                'n', n, 'f', f, 'w', w,
                'c', (extract(epoch FROM c) * 1000000)::bigint,
                'e', (extract(epoch FROM e) * 1000000)::bigint,
                'o', o, 'r', r))
$$;
