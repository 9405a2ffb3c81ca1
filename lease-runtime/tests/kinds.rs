//! `Worker::run_kinds` when every kind it serves has a limit of its own (so the claim loop, with
//! both kinds full and worker slots to spare, has to wait for one of their jobs to end): each
//! kind is held to its limit, and every kind is drained.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lease_core::{End, Kind, LeaseStore, NewRun, RunId, RunState, Ttl, WorkerId};
use lease_runtime::{CancellationToken, Kinds, MemoryLeaseStore, RunContext, Worker, WorkerConfig};

/// A handler that counts how many of its kind run at once, and the most it saw.
fn counting(
    running: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    done: Arc<AtomicUsize>,
) -> impl Fn(
    RunContext,
) -> std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<End, lease_core::BoxError>> + Send>,
> + Send
       + Sync
       + 'static {
    move |_ctx: RunContext| {
        let (running, most, done) = (running.clone(), most.clone(), done.clone());
        Box::pin(async move {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(15)).await;
            running.fetch_sub(1, Ordering::SeqCst);
            done.fetch_add(1, Ordering::SeqCst);
            Ok(End::Complete)
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_at_its_limit_waits_and_drains_each_kind() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
    let (a, b) = (Kind::new("a").unwrap(), Kind::new("b").unwrap());
    let mut batch = Vec::new();
    for i in 0..12 {
        batch.push(NewRun::new(RunId::new(format!("a-{i}")).unwrap()).with_kind(a.clone()));
        batch.push(NewRun::new(RunId::new(format!("b-{i}")).unwrap()).with_kind(b.clone()));
    }
    store.create_many_with(&batch).await.unwrap();

    let counters = || {
        (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
        )
    };
    let (a_running, a_most, a_done) = counters();
    let (b_running, b_most, b_done) = counters();
    let kinds = Kinds::new()
        .handle_limited(
            a.clone(),
            counting(a_running, a_most.clone(), a_done.clone()),
            1,
        )
        .handle_limited(
            b.clone(),
            counting(b_running, b_most.clone(), b_done.clone()),
            2,
        );
    let config = WorkerConfig::new(Ttl::from_secs(30).unwrap())
        .with_concurrency(8)
        .with_poll_interval(Duration::from_millis(20));
    let worker = Worker::new(store.clone(), WorkerId::new("w").unwrap(), config).unwrap();
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let handle = tokio::spawn(async move { worker.run_kinds(kinds, stop).await });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while a_done.load(Ordering::SeqCst) < 12 || b_done.load(Ordering::SeqCst) < 12 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not drained in 30 s: a {}, b {}",
            a_done.load(Ordering::SeqCst),
            b_done.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    shutdown.cancel();
    let report = handle.await.unwrap().unwrap();
    assert_eq!(report.completed, 24, "{report:?}");
    assert_eq!(a_most.load(Ordering::SeqCst), 1, "kind a's limit is 1");
    assert!(
        (1..=2).contains(&b_most.load(Ordering::SeqCst)),
        "kind b's limit is 2: {} at once",
        b_most.load(Ordering::SeqCst)
    );
    for i in 0..12 {
        for kind in ["a", "b"] {
            let record = store
                .inspect(&RunId::new(format!("{kind}-{i}")).unwrap())
                .await
                .unwrap();
            assert_eq!(record.state, RunState::Completed);
        }
    }
}
