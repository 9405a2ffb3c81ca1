-- $1 run_id, $2 start delay in ms (0: claimable at once), $3 payload (bytea; NULL: none), $4 kind,
-- $5 run_at in µs since the Unix epoch (NULL: none): claimable from the later of the delay's end
-- and run_at, both on the database clock; $6 priority (0 to 9); $7 unique key (NULL: none);
-- $8 queue; $9 trace parent (text; NULL: none)
-- Returns: the new record, or no row if the run exists or another live run holds the unique
-- key (sql/unique_holder.sql tells which). A delayed run is runnable and unowned
-- with claimable_at in the future, as after a retry delay: claim and claim_next wait for it,
-- on the database clock.
-- The run starts at the schema's fence floor (the highest fence of any purged run), so an id
-- purged and created again continues above every fence it carried. The floor is read in the
-- statement's snapshot: a purge of the same id that committed after it (the insert waited for
-- the purge's delete, or a REPEATABLE READ snapshot predates it) leaves the new run below the
-- floor, and its first claim lifts it (sql/claim.sql), so no fence is issued twice either way.
-- The transaction commits synchronously whatever the session says (create_in runs this inside
-- the caller's transaction).
WITH inserted AS (
    -- created_at is written, not left to its default: a default's now() is the transaction's
    -- start, which behind a pooler is the BEGIN's, not this statement's (pooler.rs).
    INSERT INTO {schema}.runs (run_id, fence, claimable_at, kind, priority, unique_key, queue,
                               created_at)
    SELECT $1, (SELECT f.fence FROM {schema}.fence_floor f),
           greatest(now() + $2::bigint * interval '1 millisecond',
                    'epoch'::timestamptz + $5::bigint * interval '1 microsecond'), $4, $6, $7, $8,
           now()
    -- No conflict target: the id's primary key and the live runs' unique keys
    -- (migrations/20261217000000_unique_keys.sql) both make it create nothing.
    ON CONFLICT DO NOTHING
    RETURNING *
), stored AS (
    -- The payload and trace parent, with the row they belong to: a purged id's old ones were
    -- deleted by the purge, so the conflict clause only guards against a row left by hand.
    INSERT INTO {schema}.run_payloads (run_id, payload, trace_parent)
    SELECT inserted.run_id, $3::bytea, $9::text FROM inserted
    WHERE $3::bytea IS NOT NULL OR $9::text IS NOT NULL
    ON CONFLICT (run_id) DO UPDATE SET payload = excluded.payload,
                                       trace_parent = excluded.trace_parent
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
       failure, attempts, $3::bytea AS payload, $9::text AS trace_parent, kind, queue, priority
FROM inserted AS r, durable
