-- $1 run_id
-- Returns: no row if the run does not exist; else its journal in order (one row with a null
-- seq when empty).
SELECT j.seq, j.fence, j.payload, (extract(epoch FROM j.written_at) * 1000000)::bigint AS written_us
FROM {schema}.runs r
LEFT JOIN {schema}.journal j ON j.run_id = r.run_id
WHERE r.run_id = $1
ORDER BY j.seq
