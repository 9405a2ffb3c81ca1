-- $1 run_id, $2 fence, $3 new state ('runnable' to release, 'suspended', 'completed')
-- Returns: one row if the lease was ended, no row when the fenced write is refused. A release
-- or a suspend is voluntary: it gives the attempt back. The attempt's end goes into the history
-- (the SET reads the old row: its number before the refund).
UPDATE {schema}.runs
SET state = $3, lease_owner = NULL, lease_expires_at = NULL, claimable_at = now(),
    history = {schema}.attempt_pushed(history, {max_history},
                                      attempts, fence, lease_owner, claimed_at, now(),
                                      CASE $3 WHEN 'runnable' THEN 'released' ELSE $3 END, NULL),
    attempts = CASE WHEN $3 IN ('runnable', 'suspended') THEN greatest(attempts - 1, 0)
                    ELSE attempts END
WHERE run_id = $1 AND fence = $2 AND state = 'runnable' AND lease_owner IS NOT NULL
RETURNING fence
