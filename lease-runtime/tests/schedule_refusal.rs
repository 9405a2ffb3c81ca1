//! A scheduler whose runs store refuses the ticks' runs as bad input stops at the first tick,
//! with the store's typed refusal, and hands its lease over at once. The runs store here is a
//! custom backend that keeps no kinds (`common::Gated`, whose gate lets everything through): it
//! implements only the required calls, so the trait's default `create_many_with` refuses a run
//! of a kind with `Unsupported`, as a user's own backend would.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_core::{
    Error, InvalidInput, Kind, LeaseStore, ListFilter, RunId, RunState, Ttl, WorkerId,
};
use lease_runtime::{CancellationToken, MemoryLeaseStore, Schedule, Scheduler};

mod common;

#[tokio::test]
async fn a_scheduler_stops_on_a_runs_store_that_refuses_its_ticks_and_releases_its_lease() {
    let runs = common::gated(|_| None);
    let leases = Arc::new(MemoryLeaseStore::new());
    let scheduler = Scheduler::new(
        runs.clone(),
        leases.clone(),
        "reports",
        Schedule::every(Duration::from_secs(1)).unwrap(),
        WorkerId::new("scheduler-1").unwrap(),
        Ttl::from_secs(30).unwrap(),
    )
    .unwrap()
    .with_kind(Kind::new("reports").unwrap());

    let started = Instant::now();
    let shutdown = CancellationToken::new();
    let outcome = tokio::time::timeout(Duration::from_secs(10), scheduler.run(shutdown.clone()))
        .await
        .expect("the scheduler stops by itself at its first tick");
    let err = outcome.unwrap_err();
    assert!(
        matches!(
            &err,
            Error::InvalidInput(InvalidInput::Unsupported {
                operation: "create_many_with"
            })
        ),
        "the store's own refusal, unchanged: {err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "stopped at the first tick (1 s interval), not after retries: {:?}",
        started.elapsed()
    );
    assert!(!shutdown.is_cancelled(), "nobody asked it to stop");

    // The lease is handed over at once (released, not left to its 30 s TTL): another
    // scheduler can take it now.
    let lease_run = RunId::new("reports").unwrap();
    let record = leases.inspect(&lease_run).await.unwrap();
    assert_eq!(record.state, RunState::Runnable);
    assert_eq!(record.owner, None, "released: {record:?}");
    leases
        .claim(
            &lease_run,
            &WorkerId::new("scheduler-2").unwrap(),
            Ttl::from_secs(5).unwrap(),
        )
        .await
        .expect("the next scheduler takes the lease at once");
    // And no tick's run was created.
    assert!(runs.list(&ListFilter::default()).await.unwrap().is_empty());
}
