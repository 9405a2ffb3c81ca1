-- $1 run_id, $2 the signal's name, $3 the fence of the wait it answers (its token's), $4 payload
-- Returns: the run's kind and whether it is claimable now, once the signal is kept as the wait's
-- answer (lease_core::signal::Delivery):
-- - the run waits in that wait, before its deadline: it is runnable and claimable now, with a
--   fresh attempt budget, its wait over;
-- - the lease of that fence still holds the run (its handler took the token and has not ended
--   yet): the run stays as it is, the signal kept, and end_many.sql answers the wait at once
--   when the lease ends waiting for that name.
-- No row otherwise: the refusal (or a duplicate of the delivery that answered the wait) is then
-- judged on a read of the record, by the rule every backend follows
-- (lease_core::signal::signal_verdict).
UPDATE {schema}.runs
SET state = 'runnable',
    claimable_at = CASE WHEN state = 'suspended' THEN now() ELSE claimable_at END,
    attempts = CASE WHEN state = 'suspended' THEN 0 ELSE attempts END,
    wait_name = NULL, wait_fence = NULL, wait_deadline = NULL,
    resumed_name = $2, resumed_fence = $3, resumed_at = now(), resumed_payload = $4
WHERE run_id = $1
  AND ((state = 'suspended'
        AND wait_fence = $3
        AND wait_name = $2
        AND (wait_deadline IS NULL OR wait_deadline > now()))
       OR (state = 'runnable'
           AND lease_owner IS NOT NULL
           AND fence = $3
           AND resumed_fence IS DISTINCT FROM $3))
RETURNING kind, lease_owner IS NULL AS claimable
