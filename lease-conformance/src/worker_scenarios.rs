//! `Worker` scenarios: the runtime over every backend.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_core::{End, Error, LeaseStore, RunId, RunState, Ttl};
use lease_runtime::{
    CancellationToken, Fault, FaultyStore, RunContext, Worker, WorkerConfig, WorkerReport,
};
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

use crate::scenarios::{run, worker};
use crate::StoreFactory;

async fn backlog(store: &dyn LeaseStore, prefix: &str, n: usize) -> Vec<RunId> {
    let ids: Vec<RunId> = (0..n).map(|i| run(&format!("{prefix}-{i:04}"))).collect();
    for chunk in ids.chunks(lease_core::MAX_BATCH) {
        let results = store.create_many(chunk).await.expect("create_many");
        assert!(results.iter().all(Result::is_ok), "{results:?}");
    }
    ids
}

fn spawn_worker<H: lease_runtime::Handler>(
    worker: Worker,
    handler: H,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<lease_core::Result<WorkerReport>>,
) {
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let handle = tokio::spawn(async move { worker.run(handler, stop).await });
    (shutdown, handle)
}

async fn state_of(store: &dyn LeaseStore, id: &RunId) -> RunState {
    store.inspect(id).await.expect("inspect").state
}

/// A worker never runs more handlers at once than its concurrency limit, reaches that limit
/// with a backlog, and completes every run, each with its effect under its own fence.
pub async fn worker_runs_at_most_its_concurrency_limit(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let ids = backlog(&*store, "limit", 40).await;
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let config = WorkerConfig::new(Ttl::from_secs(30).unwrap())
        .with_concurrency(3)
        .with_poll_interval(Duration::from_millis(20));
    let w = Worker::new(store.clone(), worker("limited"), config).unwrap();
    let (r, p) = (running.clone(), peak.clone());
    let (shutdown, handle) = spawn_worker(w, move |ctx: RunContext| {
        let (running, peak) = (r.clone(), p.clone());
        async move {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(15)).await;
            running.fetch_sub(1, Ordering::SeqCst);
            Ok(End::CompleteWith(ctx.run().as_str().as_bytes().to_vec()))
        }
    });
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        let done = store
            .list(
                &lease_core::ListFilter::new()
                    .with_state(Some(RunState::Completed))
                    .with_limit(100),
            )
            .await
            .unwrap()
            .len();
        if done == ids.len() {
            break;
        }
        assert!(
            Instant::now() < give_up,
            "only {done} of 40 runs completed in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    let report = handle.await.unwrap().unwrap();
    assert_eq!(
        peak.load(Ordering::SeqCst),
        3,
        "peak of handlers running at once"
    );
    assert_eq!(
        (report.claimed, report.started, report.completed),
        (40, 40, 40)
    );
    assert_eq!((report.refused, report.failed, report.released), (0, 0, 0));
    for id in ids.iter().step_by(7) {
        let journal = store.journal(id).await.unwrap();
        assert_eq!(journal.len(), 1);
        assert_eq!(journal[0].payload, id.as_str().as_bytes());
        assert_eq!(journal[0].fence.get(), 1);
    }
}

/// A handler that ignores its token and writes after its lease was lost (its heartbeats hung
/// past the TTL and another worker claimed the run) is refused by the fence: its late append
/// answers `StaleFence`, its effect-and-complete is refused, nothing it wrote late lands, and
/// the worker counts the end as refused, not completed.
pub async fn worker_handler_ignoring_its_token_is_still_fenced(factory: &dyn StoreFactory) {
    let inner = factory.fresh().await;
    let t = crate::timing(&*inner);
    let id = backlog(&*inner, "ignored", 1).await.remove(0);
    let faulty = Arc::new(FaultyStore::new(inner.clone()));
    let config = WorkerConfig::new(t.ttl(400))
        .with_heartbeat(t.scale(Duration::from_millis(100)))
        .with_poll_interval(Duration::from_millis(20))
        .with_concurrency(1);
    let w = Worker::new(faulty.clone(), worker("paused"), config).unwrap();
    let started = Arc::new(Notify::new());
    let go = Arc::new(Notify::new());
    let (late_tx, mut late_rx) = mpsc::unbounded_channel();
    let (s, g) = (started.clone(), go.clone());
    let (shutdown, handle) = spawn_worker(w, move |ctx: RunContext| {
        let (started, go, late_tx) = (s.clone(), g.clone(), late_tx.clone());
        async move {
            ctx.append(b"before the pause").await?;
            started.notify_one();
            go.notified().await; // ignores ctx.token() on purpose
            let late = ctx.append(b"after the pause").await;
            let _ = late_tx.send((ctx.is_cancelled(), late));
            Ok(End::CompleteWith(b"charged twice?".to_vec()))
        }
    });
    started.notified().await;
    faulty.set(Fault::Hang); // the worker's heartbeats stop reaching the store
    tokio::time::sleep(t.scale(Duration::from_millis(900)) + t.capabilities().max_expiry_lag).await;
    let b = inner
        .claim(&id, &worker("b"), Ttl::from_secs(30).unwrap())
        .await
        .expect("the run expired and is claimable");
    assert_eq!(b.fence().get(), 2);
    faulty.set(Fault::Pass);
    go.notify_one();
    let (was_cancelled, late) = late_rx.recv().await.unwrap();
    assert!(
        was_cancelled,
        "the scope was cancelled before the late write"
    );
    match late {
        Err(Error::StaleFence {
            presented: 1,
            current: 2,
            ..
        }) => {}
        other => panic!("late append: expected StaleFence 1 < 2, got {other:?}"),
    }
    shutdown.cancel();
    let report = handle.await.unwrap().unwrap();
    assert_eq!((report.completed, report.refused), (0, 1), "{report:?}");
    let record = inner.inspect(&id).await.unwrap();
    assert_eq!(record.state, RunState::Runnable);
    assert_eq!(record.owner.as_ref().map(|o| o.as_str()), Some("b"));
    let journal = inner.journal(&id).await.unwrap();
    let payloads: Vec<&[u8]> = journal.iter().map(|e| e.payload.as_slice()).collect();
    assert_eq!(
        payloads,
        vec![&b"before the pause"[..]],
        "nothing late landed"
    );
}

/// A worker shutting down lets its handlers run for the grace period, then cancels them and
/// releases their runs: a second worker, polling, claims every one within one poll interval of
/// the release (long before the TTL), each under the next fence.
pub async fn worker_shutdown_hands_runs_over_within_one_poll(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let ids = backlog(&*store, "handover", 3).await;
    let ttl = Ttl::from_secs(30).unwrap();
    let poll = Duration::from_millis(100);
    let started = Arc::new(AtomicUsize::new(0));
    let a = Worker::new(
        store.clone(),
        worker("leaving"),
        WorkerConfig::new(ttl)
            .with_concurrency(3)
            .with_grace(Duration::from_millis(200))
            .with_poll_interval(poll),
    )
    .unwrap();
    let s = started.clone();
    let (stop_a, a_handle) = spawn_worker(a, move |ctx: RunContext| {
        let started = s.clone();
        async move {
            started.fetch_add(1, Ordering::SeqCst);
            let _run = ctx.run().clone();
            // Works on past the grace period, ignoring its token: the worker aborts it.
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    });
    let give_up = Instant::now() + Duration::from_secs(10);
    while started.load(Ordering::SeqCst) < 3 {
        assert!(
            Instant::now() < give_up,
            "worker A never started its 3 handlers"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let claims = Arc::new(Mutex::new(Vec::new()));
    let b = Worker::new(
        store.clone(),
        worker("staying"),
        WorkerConfig::new(ttl)
            .with_concurrency(3)
            .with_poll_interval(poll),
    )
    .unwrap();
    let c = claims.clone();
    let (stop_b, b_handle) = spawn_worker(b, move |ctx: RunContext| {
        let claims = c.clone();
        async move {
            claims
                .lock()
                .unwrap()
                .push((Instant::now(), ctx.run().clone(), ctx.fence().get()));
            Ok(End::Complete)
        }
    });
    // B polls an empty queue long enough to back off to its full poll interval.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(claims.lock().unwrap().is_empty(), "B claimed a held run");
    stop_a.cancel();
    let a_report = a_handle.await.unwrap().unwrap();
    let released_at = Instant::now();
    assert_eq!(
        (a_report.abandoned, a_report.released),
        (3, 3),
        "{a_report:?}"
    );
    let give_up = Instant::now() + Duration::from_secs(5);
    while claims.lock().unwrap().len() < 3 {
        assert!(Instant::now() < give_up, "B did not take the released runs");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop_b.cancel();
    let b_report = b_handle.await.unwrap().unwrap();
    assert_eq!(b_report.completed, 3);
    let claims = claims.lock().unwrap().clone();
    let latest = claims.iter().map(|(at, _, _)| *at).max().unwrap();
    let took = latest.saturating_duration_since(released_at);
    assert!(
        took <= poll + Duration::from_millis(400),
        "B claimed the last released run {took:?} after A returned; poll interval {poll:?}"
    );
    let taken: HashSet<RunId> = claims.iter().map(|(_, id, _)| id.clone()).collect();
    assert_eq!(taken, ids.iter().cloned().collect::<HashSet<_>>());
    assert!(claims.iter().all(|(_, _, fence)| *fence == 2), "{claims:?}");
    for id in &ids {
        assert_eq!(state_of(&*store, id).await, RunState::Completed);
    }
}

/// No end is reported before the batch that carries it committed: while the store does not
/// answer, handlers have returned but no end is observed and the store shows no run completed;
/// once it answers, every observed completion is a completed run in the store.
pub async fn worker_reports_no_end_before_its_batch_commits(factory: &dyn StoreFactory) {
    let inner = factory.fresh().await;
    let ids = backlog(&*inner, "commit", 6).await;
    let faulty = Arc::new(FaultyStore::new(inner.clone()));
    let config = WorkerConfig::new(Ttl::from_secs(10).unwrap())
        .with_concurrency(6)
        .with_batch(6, Duration::from_millis(50));
    let observed = Arc::new(Mutex::new(Vec::new()));
    let o = observed.clone();
    let w = Worker::new(faulty.clone(), worker("committer"), config)
        .unwrap()
        .on_end(move |end| {
            if end.result.is_ok() {
                o.lock().unwrap().push(end.lease.run().clone());
            }
        });
    let returned = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let (r, g) = (returned.clone(), gate.clone());
    let (shutdown, handle) = spawn_worker(w, move |_ctx: RunContext| {
        let (returned, gate) = (r.clone(), g.clone());
        async move {
            gate.acquire().await.expect("gate open").forget();
            returned.fetch_add(1, Ordering::SeqCst);
            Ok(End::Complete)
        }
    });
    let give_up = Instant::now() + Duration::from_secs(10);
    while inner
        .list(&Default::default())
        .await
        .unwrap()
        .iter()
        .filter(|r| r.owner.is_some())
        .count()
        < 6
    {
        assert!(
            Instant::now() < give_up,
            "the worker did not claim its 6 runs"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    faulty.set(Fault::Hang); // the store stops answering before the ends are sent
    gate.add_permits(6);
    while returned.load(Ordering::SeqCst) < 6 {
        assert!(Instant::now() < give_up, "handlers did not return");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        observed.lock().unwrap().is_empty(),
        "an end was reported before it committed"
    );
    for id in &ids {
        assert_eq!(state_of(&*inner, id).await, RunState::Runnable);
    }
    faulty.set(Fault::Pass);
    let give_up = Instant::now() + Duration::from_secs(10);
    while observed.lock().unwrap().len() < 6 {
        assert!(Instant::now() < give_up, "the ends never committed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let observed = observed.lock().unwrap().clone();
    for id in &observed {
        assert_eq!(state_of(&*inner, id).await, RunState::Completed, "{id}");
    }
    shutdown.cancel();
    let report = handle.await.unwrap().unwrap();
    assert_eq!(report.completed, 6);
    assert_eq!(report.batches, 1, "one commit served the six ends");
}
