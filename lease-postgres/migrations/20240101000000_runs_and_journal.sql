-- The run record and its journal. Runs unqualified: the migrator's connection has its
-- search_path set to the store's schema, so every schema holds its own tables.

CREATE TABLE runs (
    -- COLLATE "C": ordering and `>` compare bytes, as Rust compares `str`, so `list` pages
    -- identically on every backend.
    run_id           TEXT COLLATE "C" PRIMARY KEY,
    state            TEXT NOT NULL DEFAULT 'runnable'
                     CHECK (state IN ('runnable', 'suspended', 'completed')),
    lease_owner      TEXT,
    lease_expires_at TIMESTAMPTZ,
    -- Never decreases, never repeats; i64::MAX is the last fence ever issued.
    fence            BIGINT NOT NULL DEFAULT 0 CHECK (fence >= 0),
    heartbeats       BIGINT NOT NULL DEFAULT 0 CHECK (heartbeats >= 0),
    -- When the run became (or becomes) claimable: on create, release, resume and
    -- force_release the instant of the change; while leased, the lease's expiry.
    claimable_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- Creation order, the tie-breaker of claim_next.
    created_seq      BIGINT GENERATED ALWAYS AS IDENTITY,
    -- Length of the journal, so appends take the next seq under the row lock: gapless.
    journal_len      BIGINT NOT NULL DEFAULT 0 CHECK (journal_len >= 0),
    CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL))
);

CREATE INDEX runs_claimable ON runs (claimable_at, created_seq) WHERE state = 'runnable';

CREATE TABLE journal (
    run_id     TEXT COLLATE "C" NOT NULL REFERENCES runs (run_id),
    seq        BIGINT NOT NULL CHECK (seq > 0),
    fence      BIGINT NOT NULL CHECK (fence > 0),
    payload    BYTEA NOT NULL,
    written_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, seq)
);
