-- $1 run_id, $2 start delay in ms (0: claimable at once), $3 payload (bytea; NULL: none), $4 kind,
-- $5 run_at in µs since the Unix epoch (NULL: none): claimable from the later of the delay's end
-- and run_at, both on the database clock; $6 priority (0 to 9)
-- Returns: the new record, or no row if the run exists. A delayed run is runnable and unowned
-- with claimable_at in the future, as after a retry delay: claim and claim_next wait for it,
-- on the database clock.
-- A purged id kept its row (state 'purged', its last fence): it is revived there, so its next
-- claim continues above every fence the id ever carried. The revival and the insert decide on
-- the row's latest version: under READ COMMITTED, a purge in progress is either not seen (the
-- run still exists: no row, and a retry sees the purge) or waited for; under REPEATABLE READ
-- or SERIALIZABLE, a purge committed after the transaction's snapshot makes the insert's
-- conflict check fail with a serialization failure (40001) instead of inserting below the
-- fence. Never inserts a row where one exists, purged or not.
-- The transaction commits synchronously whatever the session says (create_in runs this inside
-- the caller's transaction).
WITH revived AS (
    UPDATE {schema}.runs
    SET state = 'runnable', lease_owner = NULL, lease_expires_at = NULL, heartbeats = 0,
        created_at = now(), claimed_at = NULL, renewed_at = NULL,
        claimable_at = greatest(now() + $2::bigint * interval '1 millisecond',
                                'epoch'::timestamptz + $5::bigint * interval '1 microsecond'),
        journal_len = 0, failure = NULL, attempts = 0, history = '[]',
        created_seq = DEFAULT, kind = $4, priority = $6
    WHERE run_id = $1 AND state = 'purged'
    RETURNING *
), inserted AS (
    INSERT INTO {schema}.runs (run_id, claimable_at, kind, priority)
    SELECT $1, greatest(now() + $2::bigint * interval '1 millisecond',
                        'epoch'::timestamptz + $5::bigint * interval '1 microsecond'), $4, $6
    WHERE NOT EXISTS (SELECT 1 FROM revived)
    ON CONFLICT (run_id) DO NOTHING
    RETURNING *
), stored AS (
    -- The payload, with the row it belongs to: a purged id's old payload was deleted by the
    -- purge, so the conflict clause only guards against a row left by hand.
    INSERT INTO {schema}.run_payloads (run_id, payload)
    SELECT r.run_id, $3::bytea FROM (SELECT run_id FROM revived UNION ALL SELECT run_id FROM inserted) AS r
    WHERE $3::bytea IS NOT NULL
    ON CONFLICT (run_id) DO UPDATE SET payload = excluded.payload
), durable AS (
    SELECT set_config('synchronous_commit', 'on', true) AS setting
)
SELECT run_id, state, lease_owner, (extract(epoch FROM lease_expires_at) * 1000000)::bigint AS expires_us, fence, heartbeats, (extract(epoch FROM now()) * 1000000)::bigint AS observed_us,
       CASE WHEN state = 'runnable' AND lease_owner IS NULL AND claimable_at > now()
            THEN (extract(epoch FROM claimable_at) * 1000000)::bigint END AS not_before_us,
       CASE WHEN state = 'runnable' AND lease_owner IS NULL AND claimable_at <= now()
            THEN (extract(epoch FROM claimable_at) * 1000000)::bigint END AS claimable_since_us,
       (extract(epoch FROM created_at) * 1000000)::bigint AS created_us,
       (extract(epoch FROM claimed_at) * 1000000)::bigint AS claimed_us,
       (extract(epoch FROM renewed_at) * 1000000)::bigint AS renewed_us,
       CASE WHEN state IN ('completed', 'failed', 'cancelled')
            THEN (extract(epoch FROM claimable_at) * 1000000)::bigint END AS ended_us,
       failure, attempts, $3::bytea AS payload, kind, priority
FROM (SELECT * FROM revived UNION ALL SELECT * FROM inserted) AS r, durable
