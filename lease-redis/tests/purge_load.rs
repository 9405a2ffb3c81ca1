//! The benchmarks of a run's life against a real server (figures in BENCHMARKS.md):
//! `cargo test --release -p lease-redis --test purge_load -- --ignored --nocapture`. Ignored in
//! `cargo test`: the purge benchmark creates and completes 100,000 runs first.
lease_conformance::life_benchmarks!(lease_conformance::fixtures::redis());
