-- A store opened with wake_ups=false starts its sessions with lease.wake_ups = off, and its
-- writes notify nobody: a transaction that notifies takes the server-wide notification queue
-- lock at its commit and holds it through the commit's flush, so concurrent notifying commits
-- are flushed one after another instead of together (lease-postgres/tests/wake_cost.rs
-- measures it). Unset (every other session, a caller's own pool): notified as before.
CREATE OR REPLACE FUNCTION runs_wake() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('lease.wake_ups', true) = 'off' THEN
        RETURN NULL;
    END IF;
    PERFORM pg_notify('lease_wake_' || md5(TG_TABLE_SCHEMA),
        NEW.kind || ' ' || greatest(0, ceil(extract(epoch FROM NEW.claimable_at - now()) * 1000))::bigint);
    RETURN NULL;
END
$$;
