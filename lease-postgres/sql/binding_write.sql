-- $1 system identifier, $2 timeline
-- Binds the schema to this server: records its system identifier and timeline, whatever was
-- recorded (first use, a failover under sync_replicas, a rebind).
-- Returns: the system identifier and timeline recorded before (no row when there was none).
WITH before AS (SELECT system_identifier, timeline FROM {schema}.cluster_binding WHERE one),
     bound AS (
         INSERT INTO {schema}.cluster_binding (system_identifier, timeline, bound_at)
         VALUES ($1, $2, now())
         ON CONFLICT (one) DO UPDATE
         SET system_identifier = excluded.system_identifier,
             timeline = excluded.timeline,
             bound_at = excluded.bound_at)
SELECT system_identifier, timeline FROM before
