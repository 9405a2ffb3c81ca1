-- $1: the store's schema name
-- Returns: nothing; holds a transaction-scoped advisory lock, so workers starting at once
-- create the ledger table one after another (concurrent CREATE TABLE IF NOT EXISTS of one
-- table can fail with a duplicate pg_type entry).
SELECT pg_advisory_xact_lock(hashtextextended('distribution worker_ledger ' || $1, 0))
