//! Retention by the fleet over every backend: workers with retention purge ended runs, one at a
//! time, under a purge lease that lives in the store itself.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lease_core::{
    CancellationToken, End, FaultyStore, Kind, LeaseStore, RunContext, RunState, Worker,
    WorkerConfig, DEFAULT_PURGER_NAME, PURGER_KIND,
};
use tokio::time::Instant;

use crate::scenarios::{run, worker};
use crate::{timing, StoreFactory};

/// Two workers with retention (age zero, every second) purge every ended run exactly once,
/// those that ended before they started and those they end themselves, within two periods;
/// one holder takes the purge lease (the run `lease-purger` of kind `lease-purger`, one journal
/// entry naming it under its fence), no handler is ever given that run, and shutdown releases
/// it.
pub async fn workers_with_retention_purge_ended_runs_under_one_lease(factory: &dyn StoreFactory) {
    let t = timing(factory);
    // Retention is off on `memory:` itself; the pass-through wrapper has another name.
    let store: Arc<dyn LeaseStore> = Arc::new(FaultyStore::new(factory.fresh().await));
    let w = worker("setup");
    for i in 0..5 {
        let id = run(&format!("ended-{i}"));
        store.create(&id).await.unwrap();
        let lease = store.claim(&id, &w, t.at_least(30_000)).await.unwrap();
        store.complete(&lease).await.unwrap();
    }
    for i in 0..3 {
        store.create(&run(&format!("waiting-{i}"))).await.unwrap();
    }
    let ttl = t.at_least(3_000);
    let handled = Arc::new(AtomicU64::new(0));
    let shutdown = CancellationToken::new();
    let mut tasks = Vec::new();
    for name in ["w1", "w2"] {
        let config = WorkerConfig::new(ttl)
            .with_retention(Duration::ZERO)
            .with_retention_every(Duration::from_secs(1));
        let worker = Worker::new(store.clone(), worker(name), config).unwrap();
        let (handled, stop) = (handled.clone(), shutdown.clone());
        tasks.push(tokio::spawn(async move {
            worker
                .run(
                    move |ctx: RunContext| {
                        assert_ne!(
                            ctx.run().as_str(),
                            DEFAULT_PURGER_NAME,
                            "the purge lease run handed to a handler"
                        );
                        handled.fetch_add(1, Ordering::Relaxed);
                        async { Ok::<_, lease_core::BoxError>(End::Complete) }
                    },
                    stop,
                )
                .await
        }));
    }
    // The purger's first look comes after it takes the lease; then every second. A margin of
    // a TTL for a slow first claim.
    let limit = ttl.as_duration() + Duration::from_secs(3);
    let t0 = Instant::now();
    loop {
        let counts = store.count().await.unwrap();
        // A handler counts itself before its end commits (the Worker batches ends): the
        // waiting runs are done when they are gone, not when no completed run is left.
        let mut gone = 0;
        for i in 0..3 {
            if let Err(lease_core::Error::NotFound { .. }) =
                store.inspect(&run(&format!("waiting-{i}"))).await
            {
                gone += 1;
            }
        }
        if handled.load(Ordering::Relaxed) == 3 && gone == 3 && counts.completed == 0 {
            break;
        }
        assert!(
            t0.elapsed() < limit,
            "after {limit:?}: {} handled, {counts:?}",
            handled.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    shutdown.cancel();
    let mut reports = Vec::new();
    for task in tasks {
        reports.push(task.await.unwrap().unwrap());
    }
    let purged: u64 = reports.iter().map(|r| r.purged).sum();
    assert_eq!(purged, 8, "each ended run purged once: {reports:?}");
    let lease_run = run(DEFAULT_PURGER_NAME);
    let record = store.inspect(&lease_run).await.unwrap();
    assert_eq!(record.kind, Kind::new(PURGER_KIND).unwrap(), "{record:?}");
    assert_eq!(record.state, RunState::Runnable, "{record:?}");
    assert!(record.owner.is_none(), "released at shutdown: {record:?}");
    let journal = store.journal(&lease_run).await.unwrap();
    assert_eq!(journal.len(), 1, "one holder all along: {journal:?}");
    let said = String::from_utf8(journal[0].payload.clone()).unwrap();
    assert!(
        said == "w1 holds the purge lease" || said == "w2 holds the purge lease",
        "{said}"
    );
    assert_eq!(journal[0].fence, record.fence);
}
