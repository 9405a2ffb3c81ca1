-- $1 age in ms
-- Returns: how many runs a purge with this age would remove (through runs_ended).
SELECT count(*) AS n
FROM {schema}.runs
WHERE state IN ('completed', 'failed', 'cancelled')
  AND claimable_at <= now() - $1::bigint * interval '1 millisecond'
