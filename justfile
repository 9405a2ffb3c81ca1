# Thin recipes over cargo and the test script; every command also works without `just`.

# The fencing demo on the embedded store (pass --store URL for a real server).
demo *ARGS:
    cargo run -p lease-cli -- demo {{ARGS}}

# Run the whole test suite (installs and starts PostgreSQL and Redis itself).
test *ARGS:
    bash scripts/test.sh {{ARGS}}

# Lints, as CI runs them.
lint:
    cargo clippy --workspace --all-targets -- -D warnings
    RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --quiet

# Format the workspace.
fmt:
    cargo fmt --all

# Everything CI runs.
ci:
    bash .ci/run

# The benchmark of BENCHMARKS.md (starts private PostgreSQL and Redis servers unless --store URL).
# The takeover part runs `lease-test-worker worker` processes, so that binary is built first.
bench *ARGS:
    cargo build --release -p lease-test-worker
    cargo run --release -p lease-bench -- {{ARGS}}

# The model-based property test at soak length (100,000 sequences per backend; the test suite
# runs 1,000). Same as: LEASE_MODEL_CASES=100000 bash scripts/test.sh --release -p lease-conformance -p lease-postgres -p lease-redis --test model_memory --test model
soak CASES="100000":
    LEASE_MODEL_CASES={{CASES}} bash scripts/test.sh --release -p lease-conformance -p lease-postgres -p lease-redis --test model_memory --test model

# The protocol model, checked over every interleaving (and each deliberate flaw found).
model:
    cargo test -p lease-model -- --nocapture

# A filtered `list` over 200,000 Redis runs next to a renewing client: the worst and p99
# renewal latency during the lists, one list's time and script calls (BENCHMARKS.md).
list-bound:
    cargo test --release -p lease-redis --test list_bound -- --ignored --nocapture
