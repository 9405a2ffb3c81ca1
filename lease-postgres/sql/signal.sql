-- $1 run_id, $2 the signal's name, $3 the fence of the wait it answers (its token's), $4 payload
-- Returns: the run's kind once the signal is delivered: the run is runnable and claimable now,
-- with a fresh attempt budget, its wait over and the signal kept for its next leases. No row
-- when the run does not wait in that wait, before its deadline: the refusal (or a duplicate of
-- the delivery that answered it) is then judged on a read of the record, by the rule every
-- backend follows (lease_core::signal::signal_verdict).
UPDATE {schema}.runs
SET state = 'runnable', claimable_at = now(), attempts = 0,
    wait_name = NULL, wait_fence = NULL, wait_deadline = NULL,
    resumed_name = $2, resumed_fence = $3, resumed_at = now(), resumed_payload = $4
WHERE run_id = $1
  AND state = 'suspended'
  AND wait_fence = $3
  AND wait_name = $2
  AND (wait_deadline IS NULL OR wait_deadline > now())
RETURNING kind
