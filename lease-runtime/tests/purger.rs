//! The fleet's purger: one holder at a time, ended runs gone within two periods, runs younger
//! than the age kept, and a purger cut off from the store standing down while another takes
//! over. Real short TTLs on the memory store, with generous margins.

use std::sync::Arc;
use std::time::Duration;

use lease_core::{LeaseStore, RunId, RunState, Ttl, WorkerId};
use lease_runtime::{
    CancellationToken, Fault, FaultyStore, MemoryLeaseStore, Purger, PurgerReport,
    DEFAULT_PURGER_NAME,
};
use tokio::task::JoinHandle;
use tokio::time::{sleep, Instant};

fn id(s: &str) -> RunId {
    RunId::new(s).unwrap()
}

/// Creates `n` runs named `{prefix}-{i}`, each claimed and completed.
async fn completed(store: &Arc<dyn LeaseStore>, prefix: &str, n: usize) {
    let w = WorkerId::new("worker").unwrap();
    for i in 0..n {
        let run = id(&format!("{prefix}-{i}"));
        store.create(&run).await.unwrap();
        let lease = store
            .claim(&run, &w, Ttl::from_secs(30).unwrap())
            .await
            .unwrap();
        store.complete(&lease).await.unwrap();
    }
}

fn start(
    runs: Arc<dyn LeaseStore>,
    leases: Arc<dyn LeaseStore>,
    name: &str,
    age: Duration,
    batch: usize,
    shutdown: &CancellationToken,
) -> JoinHandle<lease_core::Result<PurgerReport>> {
    let purger = Purger::new(
        runs,
        leases,
        WorkerId::new(name).unwrap(),
        Ttl::from_secs(3).unwrap(),
    )
    .with_age(age)
    .unwrap()
    .with_every(Duration::from_secs(1))
    .unwrap()
    .with_batch(batch)
    .unwrap();
    tokio::spawn(purger.run(shutdown.child_token()))
}

/// Waits until the store counts no completed run, at most `limit`; how long it took.
async fn until_no_completed(store: &Arc<dyn LeaseStore>, limit: Duration) -> Duration {
    let t0 = Instant::now();
    loop {
        let counts = store.count().await.unwrap();
        if counts.completed == 0 {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < limit,
            "{} completed runs still there after {limit:?}",
            counts.completed
        );
        sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_purger_of_three_holds_and_ended_runs_go_within_two_periods() {
    let runs: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
    let leases: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
    completed(&runs, "early", 10).await;
    // Runs that are not ended are never purged: one waiting, one held.
    runs.create(&id("waiting")).await.unwrap();
    runs.create(&id("held")).await.unwrap();
    let held = runs
        .claim(
            &id("held"),
            &WorkerId::new("worker").unwrap(),
            Ttl::from_secs(60).unwrap(),
        )
        .await
        .unwrap();

    let shutdown = CancellationToken::new();
    let tasks: Vec<_> = ["p1", "p2", "p3"]
        .into_iter()
        .map(|p| {
            start(
                runs.clone(),
                leases.clone(),
                p,
                Duration::ZERO,
                4,
                &shutdown,
            )
        })
        .collect();
    let first = until_no_completed(&runs, Duration::from_secs(2)).await;
    // More runs end while the purgers run: gone within two periods (2 s), with a margin.
    completed(&runs, "late", 5).await;
    let second = until_no_completed(&runs, Duration::from_secs(3)).await;
    shutdown.cancel();
    let mut reports = Vec::new();
    for t in tasks {
        reports.push(t.await.unwrap().unwrap());
    }
    let held_sum: u64 = reports.iter().map(|r| r.held).sum();
    let purged: u64 = reports.iter().map(|r| r.purged).sum();
    assert_eq!(held_sum, 1, "one holder all along: {reports:?}");
    assert_eq!(purged, 15, "every ended run purged once: {reports:?}");
    let holder = reports.iter().find(|r| r.held == 1).unwrap();
    assert!(holder.batches >= 4, "batches of at most 4: {holder:?}");
    assert_eq!(holder.stood_down, 0, "{holder:?}");
    for r in reports.iter().filter(|r| r.held == 0) {
        assert_eq!(
            (r.batches, r.purged),
            (0, 0),
            "a purger without the lease purges nothing"
        );
    }
    let waiting = runs.inspect(&id("waiting")).await.unwrap();
    assert_eq!(waiting.state, RunState::Runnable);
    let still = runs.inspect(&id("held")).await.unwrap();
    assert_eq!(
        (still.state, still.fence),
        (RunState::Runnable, held.fence())
    );
    assert!(
        still.owner.is_some(),
        "the held run is still held: {still:?}"
    );
    eprintln!("purged the first 10 in {first:?}, the next 5 in {second:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_that_ended_more_recently_than_the_age_are_kept() {
    let runs: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
    let leases: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
    completed(&runs, "recent", 6).await;
    let shutdown = CancellationToken::new();
    let task = start(
        runs.clone(),
        leases,
        "p",
        Duration::from_secs(3600),
        100,
        &shutdown,
    );
    // Two periods and a half: the purger has looked at least twice.
    sleep(Duration::from_millis(2_500)).await;
    shutdown.cancel();
    let report = task.await.unwrap().unwrap();
    assert!(report.batches >= 2, "{report:?}");
    assert_eq!(report.purged, 0, "{report:?}");
    assert_eq!(runs.count().await.unwrap().completed, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purger_cut_off_stands_down_and_another_takes_over() {
    let runs: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
    let leases: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
    completed(&runs, "ended", 12).await;
    // A reaches both stores through its own link; its first purge never gets through.
    let a_runs = FaultyStore::new(runs.clone());
    let a_leases = FaultyStore::new(leases.clone());
    a_runs.set(Fault::Hang);
    let shutdown = CancellationToken::new();
    let a = start(
        Arc::new(a_runs.clone()),
        Arc::new(a_leases.clone()),
        "a",
        Duration::ZERO,
        5,
        &shutdown,
    );
    let lease_run = id(DEFAULT_PURGER_NAME);
    let t0 = Instant::now();
    loop {
        if let Ok(r) = leases.inspect(&lease_run).await {
            if r.owner.as_ref().map(ToString::to_string).as_deref() == Some("a") {
                break;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "a never took the lease"
        );
        sleep(Duration::from_millis(10)).await;
    }
    // Now A is cut off from the leases too: its renewals hang, its lease runs out.
    a_leases.set(Fault::Hang);
    let b = start(
        runs.clone(),
        leases.clone(),
        "b",
        Duration::ZERO,
        5,
        &shutdown,
    );
    // B takes over once A's lease expired (3 s TTL) and purges everything.
    let took = until_no_completed(&runs, Duration::from_secs(6)).await;
    let record = leases.inspect(&lease_run).await.unwrap();
    assert_eq!(
        record.owner.as_ref().map(ToString::to_string).as_deref(),
        Some("b"),
        "{record:?}"
    );
    assert_eq!(
        record.fence.get(),
        2,
        "A held fence 1, B fence 2: {record:?}"
    );
    shutdown.cancel();
    let a = a.await.unwrap().unwrap();
    let b = b.await.unwrap().unwrap();
    assert_eq!(
        (a.held, a.batches, a.purged, a.stood_down),
        (1, 1, 0, 1),
        "A sent one batch, stood down when its lease ended, and never purged: {a:?}"
    );
    assert_eq!((b.held, b.purged, b.stood_down), (1, 12, 0), "{b:?}");
    assert!(b.batches >= 3, "batches of at most 5: {b:?}");
    // A's hung batch was abandoned, not delivered late: nothing more happens when A's link
    // heals.
    a_runs.set(Fault::Pass);
    a_leases.set(Fault::Pass);
    assert_eq!(runs.count().await.unwrap().completed, 0);
    eprintln!("B purged every run {took:?} after A was cut off");
}

/// Three workers with retention on one store (the memory store behind a pass-through
/// `FaultyStore`: retention is off on `memory:` itself): one purges at a time, ended runs are
/// gone within two periods, and no worker takes the purge lease's run for a job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_with_retention_purge_ended_runs_one_at_a_time() {
    use lease_core::{End, Kind};
    use lease_runtime::{RunContext, Worker, WorkerConfig, PURGER_KIND};
    use std::sync::atomic::{AtomicU64, Ordering};

    let store: Arc<dyn LeaseStore> = Arc::new(FaultyStore::new(Arc::new(MemoryLeaseStore::new())));
    completed(&store, "old", 10).await;
    for i in 0..5 {
        store.create(&id(&format!("new-{i}"))).await.unwrap();
    }
    let handled = Arc::new(AtomicU64::new(0));
    let shutdown = CancellationToken::new();
    let mut tasks = Vec::new();
    for w in ["w1", "w2", "w3"] {
        let config = WorkerConfig::new(Ttl::from_secs(3).unwrap())
            .with_retention(Duration::ZERO)
            .with_retention_every(Duration::from_secs(1));
        let worker = Worker::new(store.clone(), WorkerId::new(w).unwrap(), config).unwrap();
        let handled = handled.clone();
        let stop = shutdown.clone();
        tasks.push(tokio::spawn(async move {
            worker
                .run(
                    move |ctx: RunContext| {
                        assert_ne!(ctx.run().as_str(), DEFAULT_PURGER_NAME);
                        handled.fetch_add(1, Ordering::Relaxed);
                        async { Ok::<_, lease_core::BoxError>(End::Complete) }
                    },
                    stop,
                )
                .await
        }));
    }
    // The 5 new runs are handled and, with the 10 old ones, purged within two periods of
    // their end (2 s), with a margin.
    let t0 = Instant::now();
    while handled.load(Ordering::Relaxed) < 5 {
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "the workers did not run the new runs"
        );
        sleep(Duration::from_millis(10)).await;
    }
    // A handler counts itself before its end commits (the Worker batches ends): wait until the
    // new runs are gone, not only until no completed run is left.
    let took = until_no_completed(&store, Duration::from_secs(3)).await;
    let t1 = Instant::now();
    for i in 0..5 {
        while !matches!(
            store.inspect(&id(&format!("new-{i}"))).await,
            Err(lease_core::Error::NotFound { .. })
        ) {
            assert!(
                t1.elapsed() < Duration::from_secs(3),
                "new-{i} never purged"
            );
            sleep(Duration::from_millis(20)).await;
        }
    }
    shutdown.cancel();
    let mut purged = 0;
    for t in tasks {
        purged += t.await.unwrap().unwrap().purged;
    }
    assert_eq!(purged, 15, "every ended run purged once");
    assert_eq!(handled.load(Ordering::Relaxed), 5);
    let lease_run = store.inspect(&id(DEFAULT_PURGER_NAME)).await.unwrap();
    assert_eq!(
        lease_run.kind,
        Kind::new(PURGER_KIND).unwrap(),
        "{lease_run:?}"
    );
    assert_eq!(lease_run.state, RunState::Runnable, "released at shutdown");
    let journal = store.journal(&id(DEFAULT_PURGER_NAME)).await.unwrap();
    assert_eq!(journal.len(), 1, "one holder all along: {journal:?}");
    let entry = String::from_utf8(journal[0].payload.clone()).unwrap();
    assert!(
        ["w1", "w2", "w3"]
            .iter()
            .any(|w| entry == format!("{w} holds the purge lease")),
        "{entry}"
    );
    assert_eq!(journal[0].fence, lease_run.fence);
    eprintln!("ended runs purged {took:?} after the last one ended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_is_off_on_the_memory_store_and_the_purge_kind_is_not_served() {
    use lease_core::{End, Error, InvalidInput, Kind};
    use lease_runtime::{Kinds, RunContext, Worker, WorkerConfig, PURGER_KIND};

    let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
    completed(&store, "old", 3).await;
    let config = WorkerConfig::new(Ttl::from_secs(3).unwrap())
        .with_retention(Duration::ZERO)
        .with_retention_every(Duration::from_secs(1));
    let worker = Worker::new(store.clone(), WorkerId::new("w").unwrap(), config.clone()).unwrap();
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let task = tokio::spawn(async move {
        worker
            .run(
                |_ctx: RunContext| async { Ok::<_, lease_core::BoxError>(End::Complete) },
                stop,
            )
            .await
    });
    sleep(Duration::from_millis(1_500)).await;
    shutdown.cancel();
    assert_eq!(task.await.unwrap().unwrap().purged, 0);
    assert_eq!(store.count().await.unwrap().completed, 3);
    assert!(matches!(
        store.inspect(&id(DEFAULT_PURGER_NAME)).await,
        Err(Error::NotFound { .. })
    ));

    let worker = Worker::new(store.clone(), WorkerId::new("w").unwrap(), config).unwrap();
    let kinds = Kinds::new().handle(Kind::new(PURGER_KIND).unwrap(), |_ctx: RunContext| async {
        Ok::<_, lease_core::BoxError>(End::Complete)
    });
    let e = worker
        .run_kinds(kinds, CancellationToken::new())
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::InvalidInput(InvalidInput::WorkerSetting { setting: "kinds", value, .. }) if value == PURGER_KIND),
        "{e}"
    );

    let e = Worker::new(
        store,
        WorkerId::new("w").unwrap(),
        WorkerConfig::new(Ttl::from_secs(3).unwrap())
            .with_retention_every(Duration::from_millis(10)),
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            InvalidInput::WorkerSetting {
                setting: "retention every",
                ..
            }
        ),
        "{e}"
    );
}

/// A Worker purges by default as River does: completed runs a day after they ended, failed and
/// cancelled ones after a week; `with_retention_policy(None)` keeps everything. On a paused
/// clock (the memory store's clock is Tokio's), so days pass at once; the store is wrapped so
/// that it is not `memory:` (where retention is off).
#[tokio::test(start_paused = true)]
async fn a_worker_purges_completed_runs_after_a_day_and_failures_after_a_week_by_default() {
    use lease_core::{End, LeaseStoreExt};
    use lease_runtime::{RunContext, Worker, WorkerConfig};

    let run_worker = |store: Arc<dyn LeaseStore>, config: WorkerConfig, days: u64| async move {
        // Slow polls: fewer wake-ups to step through while days pass.
        let config = config
            .with_poll_interval(Duration::from_secs(60))
            .with_wake_poll_interval(Duration::from_secs(60));
        let worker = Worker::new(store, WorkerId::new("w").unwrap(), config).unwrap();
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let task = tokio::spawn(async move {
            worker
                .run(
                    |_ctx: RunContext| async { Ok::<_, lease_core::BoxError>(End::Complete) },
                    stop,
                )
                .await
        });
        sleep(Duration::from_secs(days * 86_400 + 120)).await;
        shutdown.cancel();
        task.await.unwrap().unwrap()
    };
    let fill = |store: Arc<dyn LeaseStore>| async move {
        completed(&store, "done", 3).await;
        let w = WorkerId::new("setup").unwrap();
        for i in 0..2 {
            let run = id(&format!("failed-{i}"));
            store.create(&run).await.unwrap();
            let lease = store
                .claim(&run, &w, Ttl::from_secs(30).unwrap())
                .await
                .unwrap();
            store.fail(&lease, "boom").await.unwrap();
        }
        store.create(&id("cancelled")).await.unwrap();
        store.cancel(&id("cancelled"), "operator").await.unwrap();
    };
    let ended = |store: Arc<dyn LeaseStore>| async move {
        let c = store.count().await.unwrap();
        (c.completed, c.failed, c.cancelled)
    };
    // A long TTL: fewer heartbeats to step through while days pass.
    let ttl = Ttl::from_secs(600).unwrap();

    let store: Arc<dyn LeaseStore> = Arc::new(FaultyStore::new(Arc::new(MemoryLeaseStore::new())));
    fill(store.clone()).await;
    let report = run_worker(store.clone(), WorkerConfig::new(ttl), 1).await;
    assert_eq!(
        ended(store.clone()).await,
        (0, 2, 1),
        "a day: completed runs purged"
    );
    assert_eq!(report.purged, 3);
    let report = run_worker(store.clone(), WorkerConfig::new(ttl), 6).await;
    assert_eq!(
        ended(store.clone()).await,
        (0, 0, 0),
        "a week: failures purged"
    );
    assert_eq!(report.purged, 3);

    let store: Arc<dyn LeaseStore> = Arc::new(FaultyStore::new(Arc::new(MemoryLeaseStore::new())));
    fill(store.clone()).await;
    let keep_all = WorkerConfig::new(ttl).with_retention_policy(None);
    let report = run_worker(store.clone(), keep_all, 8).await;
    assert_eq!(
        ended(store.clone()).await,
        (3, 2, 1),
        "None keeps every run"
    );
    assert_eq!(report.purged, 0);
    assert!(
        store.inspect(&id(DEFAULT_PURGER_NAME)).await.is_err(),
        "no purge lease taken"
    );
}
