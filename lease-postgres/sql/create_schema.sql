-- (no parameters; {schema} is the quoted schema name)
-- Creates the store's schema; run under the migration lock.
CREATE SCHEMA IF NOT EXISTS {schema}
