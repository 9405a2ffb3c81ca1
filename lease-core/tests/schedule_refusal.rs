//! A scheduler whose runs store refuses the ticks' runs as bad input stops at the first tick,
//! with the store's typed refusal, and hands its lease over at once. The runs store here is a
//! custom backend that keeps no kinds: it implements only the required calls, so the trait's
//! default `create_many_with` refuses a run of a kind with `Unsupported`, as a user's own
//! backend would.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_core::{
    CancellationToken, Ending, Error, InvalidInput, JournalEntry, Kind, Lease, LeaseStore,
    ListFilter, MemoryLeaseStore, Result, RunId, RunRecord, RunState, Schedule, Scheduler, Ttl,
    WorkerId,
};

/// The memory store behind only the required calls of `LeaseStore`.
#[derive(Debug)]
struct Plain(MemoryLeaseStore);

impl std::fmt::Display for Plain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a store without kinds")
    }
}

#[async_trait::async_trait]
impl LeaseStore for Plain {
    async fn create(&self, run: &RunId) -> Result<RunRecord> {
        self.0.create(run).await
    }
    async fn claim(&self, run: &RunId, worker: &WorkerId, ttl: Ttl) -> Result<Lease> {
        self.0.claim(run, worker, ttl).await
    }
    async fn claim_next(&self, worker: &WorkerId, ttl: Ttl, max: usize) -> Result<Vec<Lease>> {
        self.0.claim_next(worker, ttl, max).await
    }
    async fn renew(&self, lease: &Lease) -> Result<Lease> {
        self.0.renew(lease).await
    }
    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        self.0.renew_many(leases).await
    }
    async fn append(&self, lease: &Lease, payload: &[u8]) -> Result<JournalEntry> {
        self.0.append(lease, payload).await
    }
    async fn journal(&self, run: &RunId) -> Result<Vec<JournalEntry>> {
        self.0.journal(run).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.0.release(lease).await
    }
    async fn suspend(&self, lease: &Lease) -> Result<()> {
        self.0.suspend(lease).await
    }
    async fn end_many(&self, ends: &[Ending]) -> Result<Vec<Result<()>>> {
        self.0.end_many(ends).await
    }
    async fn create_many(&self, runs: &[RunId]) -> Result<Vec<Result<()>>> {
        self.0.create_many(runs).await
    }
    async fn resume(&self, run: &RunId) -> Result<RunRecord> {
        self.0.resume(run).await
    }
    async fn complete(&self, lease: &Lease) -> Result<()> {
        self.0.complete(lease).await
    }
    async fn inspect(&self, run: &RunId) -> Result<RunRecord> {
        self.0.inspect(run).await
    }
    async fn list(&self, filter: &ListFilter) -> Result<Vec<RunRecord>> {
        self.0.list(filter).await
    }
    async fn force_release(&self, run: &RunId) -> Result<RunRecord> {
        self.0.force_release(run).await
    }
}

#[tokio::test]
async fn a_scheduler_stops_on_a_runs_store_that_refuses_its_ticks_and_releases_its_lease() {
    let runs = Arc::new(Plain(MemoryLeaseStore::new()));
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
