-- The worker's external side-effect ledger: a caller-owned table, written only inside a fenced
-- transaction. Deliberately no uniqueness constraint: a double execution shows as two rows
-- instead of hiding behind a conflict error.
-- {schema}: the store's schema, quoted by the caller.
CREATE TABLE IF NOT EXISTS {schema}.worker_ledger (
    id          BIGSERIAL PRIMARY KEY,
    run_id      TEXT        NOT NULL,
    effect      TEXT        NOT NULL,
    fence       BIGINT      NOT NULL,
    worker_id   TEXT        NOT NULL,
    recorded_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
)
