-- $1 the lock wait in milliseconds, as text
-- Behind a transaction pooler (pooler.rs): bounds the rest of the caller's transaction's waits
-- for row locks as the store's sessions are bounded (set_config(.., true) is SET LOCAL), before
-- lock_run.sql waits for the run's row.
SELECT set_config('lock_timeout', $1, true)
