-- The newest migration applied to the store's schema (NULL when none succeeded). Run only once
-- sql/schema_migrated.sql found the bookkeeping table.
SELECT max(version) AS version FROM {schema}._sqlx_migrations WHERE success
