-- $1 run_id
-- Returns: the run's fence verdict inputs, locking the row until the transaction ends, or no
-- row if the run does not exist.
SELECT state, lease_owner, fence
FROM {schema}.runs WHERE run_id = $1
FOR UPDATE
