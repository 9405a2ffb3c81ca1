-- Wake-ups (lease_core::LeaseStore::wakes): a write that leaves a run runnable and unowned
-- (a create, a release, a retry delay, a resume, a force-release, the same writes in a
-- caller's transaction) notifies the schema's channel, lease_wake_<md5 of the schema name>,
-- with the run's kind and the milliseconds until it is claimable on the database clock,
-- separated by the last space. NOTIFY is transactional: a listener hears of the run when the
-- write commits, never before, and never of a write rolled back. Identical notifications of
-- one transaction are delivered once, so a batch of runs of one kind costs one. Renewals,
-- claims and ends that leave a run held or ended fail the WHEN clause and call nothing.
CREATE FUNCTION runs_wake() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('lease_wake_' || md5(TG_TABLE_SCHEMA),
        NEW.kind || ' ' || greatest(0, ceil(extract(epoch FROM NEW.claimable_at - now()) * 1000))::bigint);
    RETURN NULL;
END
$$;

CREATE TRIGGER runs_wake AFTER INSERT OR UPDATE ON runs
    FOR EACH ROW WHEN (NEW.state = 'runnable' AND NEW.lease_owner IS NULL)
    EXECUTE FUNCTION runs_wake();
