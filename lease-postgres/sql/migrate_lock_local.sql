-- $1 schema name
-- Behind a transaction pooler (pooler.rs): serializes migrations of one schema across every
-- process until the migrating transaction ends. The same key as migrate_lock.sql, whose
-- session-level lock conflicts with this one, so stores with and without a pooler serialize.
SELECT pg_advisory_xact_lock(hashtextextended('lease-postgres migrate ' || $1, 0))
