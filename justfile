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
bench *ARGS:
    cargo run --release -p lease-cli -- bench {{ARGS}}
