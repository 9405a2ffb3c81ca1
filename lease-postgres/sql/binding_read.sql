-- (no parameters)
-- Run on every new connection of a store, after the durability checks. Returns: the server's
-- system identifier and the timeline its WAL is written on now (migration
-- 20261214000000_cluster_binding says why these and how they are read), and the ones the
-- schema is bound to (both NULL when the binding row is missing: first use binds).
SELECT (SELECT system_identifier FROM pg_control_system()) AS system_identifier,
       ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint AS timeline,
       b.system_identifier AS bound_system_identifier,
       b.timeline AS bound_timeline
FROM (SELECT 1) AS here
LEFT JOIN {schema}.cluster_binding b ON b.one
