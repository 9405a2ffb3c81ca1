//! The purge benchmark against a real server: `cargo test --release -p lease-postgres --test purge_load
//! -- --ignored --nocapture` (figures in BENCHMARKS.md). Ignored in `cargo test`: it creates
//! and completes 100,000 runs first.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run with --ignored --release"]
async fn purging_100_000_runs_while_1_000_leases_are_renewed() {
    let Some(factory) = lease_conformance::fixtures::postgres().await else {
        return;
    };
    let line = lease_conformance::purge_under_load(factory.fresh().await).await;
    eprintln!("purge_load: {line}");
}

/// A poison run's claims per second: released at once (the Worker before retry policies)
/// against the default retry policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run with --ignored --release"]
async fn a_poison_run_is_claimed_again_at_once_without_backoff() {
    use std::time::Duration;
    let Some(factory) = lease_conformance::fixtures::postgres().await else {
        return;
    };
    let window = Duration::from_secs(3);
    let at_once = lease_core::RetryPolicy::default()
        .with_backoff(Duration::ZERO, Duration::ZERO)
        .without_max_attempts();
    let before = lease_conformance::poison_claim_rate(factory.fresh().await, at_once, window).await;
    let after = lease_conformance::poison_claim_rate(
        factory.fresh().await,
        lease_core::RetryPolicy::default(),
        window,
    )
    .await;
    eprintln!(
        "poison run, claims per second over {window:?}: released at once {before:.0}, \
         default retry policy {after:.2}"
    );
}
