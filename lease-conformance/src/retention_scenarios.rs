//! Retention by the fleet over every backend: workers with retention purge ended runs, one at a
//! time, under a purge lease that lives in the store itself.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lease_core::{End, Kind, LeaseStore, LeaseStoreExt, RunState};
use lease_runtime::{
    CancellationToken, FaultyStore, RunContext, Worker, WorkerConfig, DEFAULT_PURGER_NAME,
    PURGER_KIND,
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
    // Retention is off on `memory:` itself; the pass-through wrapper has another name.
    let store: Arc<dyn LeaseStore> = Arc::new(FaultyStore::new(factory.fresh().await));
    let t = timing(&*store);
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

/// `purge_ended` removes the runs of the states asked for and no other: completed runs go
/// while failed and cancelled ones stay, then those go too; each call is bounded by `max`,
/// oldest end first. Runs of other states are passed over however many come before: 150
/// failed runs ended before the completed ones do not keep the completed ones from being
/// purged (the Redis backend passes over such entries once per set of states, not every
/// call), and a purged id created again is claimed above its old fence.
pub async fn purge_ended_removes_only_the_states_asked(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let t = timing(&*store);
    let w = worker("w");
    let ttl = t.at_least(30_000);
    let mut fences = std::collections::HashMap::new();
    let end = |i: usize, how: &'static str| {
        let store = store.clone();
        let w = w.clone();
        async move {
            let id = run(&format!("{how}-{i}"));
            store.create(&id).await.unwrap();
            let lease = store.claim(&id, &w, ttl).await.unwrap();
            match how {
                "failed" => store.fail(&lease, "boom").await.unwrap(),
                "cancelled" => {
                    store.cancel(&id, "operator").await.unwrap();
                }
                _ => store.complete(&lease).await.unwrap(),
            }
            (id, lease.fence())
        }
    };
    for i in 0..150 {
        let (id, fence) = end(i, "failed").await;
        fences.insert(id, fence);
    }
    for i in 0..5 {
        let (id, fence) = end(i, "cancelled").await;
        fences.insert(id, fence);
    }
    for i in 0..30 {
        let (id, fence) = end(i, "completed").await;
        fences.insert(id, fence);
    }
    let completed = lease_core::EndedStates::COMPLETED;
    let hour = Duration::from_secs(3600);
    assert!(
        store
            .purge_ended(completed, hour, 100)
            .await
            .unwrap()
            .is_empty(),
        "nothing ended an hour ago"
    );
    let first = store
        .purge_ended(completed, Duration::ZERO, 20)
        .await
        .unwrap();
    assert_eq!(first.len(), 20, "bounded by max: {first:?}");
    let rest = store
        .purge_ended(completed, Duration::ZERO, 100)
        .await
        .unwrap();
    assert_eq!(rest.len(), 10, "the other completed runs: {rest:?}");
    assert!(first
        .iter()
        .chain(&rest)
        .all(|id| id.as_str().starts_with("completed-")));
    let counts = store.count().await.unwrap();
    assert_eq!(
        (counts.completed, counts.failed, counts.cancelled),
        (0, 150, 5),
        "failed and cancelled runs kept"
    );
    let kept = lease_core::EndedStates::FAILED | lease_core::EndedStates::CANCELLED;
    let mut gone = Vec::new();
    loop {
        let batch = store.purge_ended(kept, Duration::ZERO, 100).await.unwrap();
        if batch.is_empty() {
            break;
        }
        gone.extend(batch);
    }
    assert_eq!(gone.len(), 155, "every failed and cancelled run");
    let counts = store.count().await.unwrap();
    assert_eq!((counts.failed, counts.cancelled), (0, 0));
    for id in [run("completed-3"), run("failed-7"), run("cancelled-1")] {
        store.create(&id).await.unwrap();
        let lease = store.claim(&id, &w, ttl).await.unwrap();
        assert!(
            lease.fence() > fences[&id],
            "{id} created again is claimed at {} after {}",
            lease.fence(),
            fences[&id]
        );
    }
}

/// `purge_ids` removes the listed runs that ended, whatever their age, and leaves the others
/// (held, runnable, suspended, missing) as they are; an id listed twice is removed once, and
/// a removed id created again is claimed above its old fence.
pub async fn purge_ids_removes_the_listed_ended_runs_only(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let t = timing(&*store);
    let w = worker("w");
    let ttl = t.at_least(30_000);
    let ids: Vec<_> = ["done", "failed", "held", "waiting", "parked"]
        .iter()
        .map(|s| run(s))
        .collect();
    for id in &ids {
        store.create(id).await.unwrap();
    }
    let done = store.claim(&ids[0], &w, ttl).await.unwrap();
    store.complete(&done).await.unwrap();
    let failed = store.claim(&ids[1], &w, ttl).await.unwrap();
    store.fail(&failed, "boom").await.unwrap();
    let held = store.claim(&ids[2], &w, ttl).await.unwrap();
    let parked = store.claim(&ids[4], &w, ttl).await.unwrap();
    store.suspend(&parked).await.unwrap();
    let mut asked = ids.clone();
    asked.push(run("missing"));
    asked.push(ids[0].clone());
    let mut purged = store.purge_ids(&asked).await.unwrap();
    purged.sort();
    let mut want = vec![ids[0].clone(), ids[1].clone()];
    want.sort();
    assert_eq!(purged, want);
    for id in &ids[..2] {
        assert!(
            matches!(
                store.inspect(id).await,
                Err(lease_core::Error::NotFound { .. })
            ),
            "{id} removed"
        );
    }
    assert_eq!(store.inspect(&ids[2]).await.unwrap().fence, held.fence());
    assert_eq!(
        store.inspect(&ids[4]).await.unwrap().state,
        RunState::Suspended
    );
    assert_eq!(
        store.inspect(&ids[3]).await.unwrap().state,
        RunState::Runnable
    );
    assert!(store.purge_ids(&[]).await.unwrap().is_empty());
    store.create(&ids[0]).await.unwrap();
    let again = store.claim(&ids[0], &w, ttl).await.unwrap();
    assert!(
        again.fence() > done.fence(),
        "{} after {}",
        again.fence(),
        done.fence()
    );
    store
        .renew(&held)
        .await
        .expect("the held run's lease is untouched");
}
