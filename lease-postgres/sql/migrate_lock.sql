-- $1 schema name
-- Serializes migrations of one schema across every process; released when the session ends.
SELECT pg_advisory_lock(hashtextextended('lease-postgres migrate ' || $1, 0))
