-- (no parameters)
-- Returns: 'on'. Makes the transaction it runs in commit synchronously (transaction-local,
-- as SET LOCAL), whatever the caller's statements set after the store's lock (SET LOCAL or
-- SET synchronous_commit = off): the last statement of a fenced transaction committed without
-- an ending statement (which would say the same itself, as end_many.sql does).
SELECT set_config('synchronous_commit', 'on', true)
