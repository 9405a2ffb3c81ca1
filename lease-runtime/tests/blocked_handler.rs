//! A `Worker` whose handler blocks its thread (`std::thread::sleep`: it never yields, so an
//! abort cannot land) on a multi-thread runtime: the attempt deadline still fails the attempt,
//! frees the slot and stops the renewals, the shutdown still returns within its grace, and the
//! stuck handler's late write is refused by the fence.
//!
//! Real time with wide margins: paused time cannot pause a blocked thread. Each test spawns the
//! worker on the runtime, so its loop shares the one thread the handler leaves free.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use lease_core::{End, Ended, Error, LeaseStore, RunId, RunRecord, RunState, Ttl, WorkerId};
use lease_runtime::{
    CancellationToken, MemoryLeaseStore, RetryPolicy, RunContext, Worker, WorkerConfig,
    WorkerReport,
};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How long the handler blocks its thread: longer than every deadline the tests wait for.
const BLOCK: Duration = Duration::from_secs(10);

type LateWrite = lease_core::Result<lease_core::JournalEntry>;

fn id(s: &str) -> RunId {
    RunId::new(s).unwrap()
}

/// Starts a worker whose handler, for the run `blocks`, reports that it started, blocks its
/// thread for [`BLOCK`], then appends to the journal under its lease and reports the store's
/// verdict; it completes every other run at once.
fn start(
    store: &Arc<dyn LeaseStore>,
    config: WorkerConfig,
) -> (
    JoinHandle<lease_core::Result<WorkerReport>>,
    CancellationToken,
    mpsc::Receiver<Instant>,
    mpsc::Receiver<LateWrite>,
) {
    let (started_tx, started) = mpsc::channel();
    let (late_tx, late) = mpsc::channel();
    let worker = Worker::new(store.clone(), WorkerId::new("blocker").unwrap(), config).unwrap();
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let running = tokio::spawn(async move {
        worker
            .run(
                move |ctx: RunContext| {
                    let (started_tx, late_tx) = (started_tx.clone(), late_tx.clone());
                    async move {
                        if ctx.run().as_str() == "blocks" {
                            let _ = started_tx.send(Instant::now());
                            std::thread::sleep(BLOCK);
                            // The memory store answers without yielding, so this write is
                            // sent even though the task was aborted meanwhile.
                            let _ = late_tx.send(ctx.append(b"late").await);
                        }
                        Ok(End::Complete)
                    }
                },
                stop,
            )
            .await
    });
    (running, shutdown, started, late)
}

/// Polls `rx` until a message arrives or `within` passes.
async fn receive<T>(rx: &mpsc::Receiver<T>, within: Duration, what: &str) -> T {
    let deadline = Instant::now() + within;
    loop {
        match rx.try_recv() {
            Ok(value) => return value,
            Err(mpsc::TryRecvError::Disconnected) => panic!("{what}: the handler went away"),
            Err(mpsc::TryRecvError::Empty) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(mpsc::TryRecvError::Empty) => panic!("{what}: nothing within {within:?}"),
        }
    }
}

/// Polls `run`'s record until `done` holds or `within` passes; returns the record.
async fn until(
    store: &dyn LeaseStore,
    run: &RunId,
    within: Duration,
    done: impl Fn(&RunRecord) -> bool,
) -> RunRecord {
    let deadline = Instant::now() + within;
    loop {
        let record = store.inspect(run).await.unwrap();
        if done(&record) {
            return record;
        }
        assert!(
            Instant::now() < deadline,
            "{run} not there within {within:?}: {:?}, owner {:?}, attempts {}, fence {}",
            record.state,
            record.owner,
            record.attempts,
            record.fence
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A handler blocking its thread past its 1 s attempt deadline and the 1 s grace: the attempt
/// fails (its only one: the run fails with the deadline as its reason), the renewals stop,
/// the slot serves the next run while the thread is still blocked, the shutdown returns at
/// once, and the handler's write when it wakes is refused as written after the lease ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_blocking_its_thread_fails_at_its_attempt_deadline() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
    let blocks = id("blocks");
    store.create(&blocks).await.unwrap();
    let config = WorkerConfig::new(Ttl::from_secs(30).unwrap())
        .with_concurrency(1)
        .with_poll_interval(Duration::from_millis(10))
        .with_attempt_timeout(Duration::from_secs(1))
        .with_grace(Duration::from_secs(1))
        .with_retry(RetryPolicy::default().with_max_attempts(1));
    let (running, shutdown, started, late) = start(&store, config);
    let since = receive(&started, Duration::from_secs(5), "the handler's start").await;

    // Deadline (1 s) plus grace (1 s) plus a batch; 6 s is three times that, well inside BLOCK.
    // (The deadline runs from just before the handler's first poll, `since` from within it.)
    let failed = until(&*store, &blocks, Duration::from_secs(6), |r| {
        r.state != RunState::Runnable
    })
    .await;
    assert_eq!(failed.state, RunState::Failed, "{failed:?}");
    assert_eq!(failed.attempts, 1);
    assert_eq!(failed.owner, None);
    let reason = failed.failure.clone().unwrap_or_default();
    assert!(reason.contains("attempt timed out after 1s"), "{reason}");
    assert!(
        since.elapsed() >= Duration::from_millis(1_900),
        "{:?}",
        since.elapsed()
    );

    // The slot is free and the loop runs while the handler's thread is still blocked.
    let after = id("after");
    store.create(&after).await.unwrap();
    until(&*store, &after, Duration::from_secs(5), |r| {
        r.state == RunState::Completed
    })
    .await;
    assert!(since.elapsed() < BLOCK, "the thread was no longer blocked");

    shutdown.cancel();
    let stopping = Instant::now();
    let report = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("Worker::run returned within 10 s of the shutdown")
        .unwrap()
        .unwrap();
    assert!(
        stopping.elapsed() < Duration::from_secs(2),
        "{:?}",
        stopping.elapsed()
    );
    assert_eq!(report.timed_out, 1, "{report:?}");
    assert_eq!(report.completed, 1, "{report:?}");

    // The renewals stopped with the attempt: nothing renewed the failed lease since.
    let heartbeats = store.inspect(&blocks).await.unwrap().heartbeats;
    assert_eq!(heartbeats, failed.heartbeats);

    let written = receive(&late, BLOCK + Duration::from_secs(10), "the late write").await;
    match written {
        Err(Error::LeaseEnded {
            fence: 1,
            ended: Ended::Failed,
            ..
        }) => {}
        other => panic!("the stuck handler's late write was not refused: {other:?}"),
    }
    assert!(store.journal(&blocks).await.unwrap().is_empty());
}

/// A shutdown while a handler blocks its thread (no attempt deadline): `Worker::run` returns
/// within its 1 s grace and a store call, the run released at once for another worker (the
/// attempt not counted), and the handler's write when it wakes is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_returns_within_its_grace_while_a_handler_blocks_its_thread() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
    let blocks = id("blocks");
    store.create(&blocks).await.unwrap();
    let config = WorkerConfig::new(Ttl::from_secs(30).unwrap())
        .with_poll_interval(Duration::from_millis(10))
        .with_grace(Duration::from_secs(1));
    let (running, shutdown, started, late) = start(&store, config);
    receive(&started, Duration::from_secs(5), "the handler's start").await;

    shutdown.cancel();
    let stopping = Instant::now();
    let returned = tokio::time::timeout(Duration::from_secs(10), running).await;
    let took = stopping.elapsed();
    let report = returned
        .expect("Worker::run returned within 10 s of the shutdown")
        .unwrap()
        .unwrap();
    // The grace (1 s) and one call to the memory store; 3 s is a wide margin, and well short
    // of BLOCK.
    assert!(
        took < Duration::from_secs(3),
        "returned {took:?} after the shutdown"
    );
    assert_eq!(report.abandoned, 1, "{report:?}");

    let record = store.inspect(&blocks).await.unwrap();
    assert_eq!(record.state, RunState::Runnable, "{record:?}");
    assert_eq!(record.owner, None, "released, claimable at once");
    assert_eq!(
        record.attempts, 0,
        "a shutdown does not spend the run's budget"
    );

    let written = receive(&late, BLOCK + Duration::from_secs(10), "the late write").await;
    match written {
        Err(Error::LeaseEnded {
            fence: 1,
            ended: Ended::Released,
            ..
        }) => {}
        other => panic!("the stuck handler's late write was not refused: {other:?}"),
    }
}

/// The acceptance case: the default retry policy, so each retry of the run blocks a thread
/// again. After the first attempt blocked past its stop, the worker runs its handlers on
/// threads of their own, so the retry's block leaves the runtime's two threads to the worker:
/// the run is claimable again (or failed) well within 15 s, and `Worker::run` returns within
/// its grace of the shutdown, while two handlers' threads are still blocked. Before, the
/// retry blocked the runtime's second thread and nothing of the worker ran until a block
/// ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_of_a_blocking_handler_leave_the_runtime_to_the_worker() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
    let blocks = id("blocks");
    store.create(&blocks).await.unwrap();
    let config = WorkerConfig::new(Ttl::from_secs(30).unwrap())
        .with_poll_interval(Duration::from_millis(10))
        .with_attempt_timeout(Duration::from_secs(1))
        .with_grace(Duration::from_secs(1));
    let (running, shutdown, started, _late) = start(&store, config);
    let first = receive(&started, Duration::from_secs(5), "the first attempt").await;
    // Deadline and grace (2 s), then claimable again after the policy's first delay.
    let record = until(&*store, &blocks, Duration::from_secs(15), |r| {
        r.owner.is_none() || r.fence.get() > 1
    })
    .await;
    assert_eq!(record.state, RunState::Runnable, "retried: {record:?}");
    assert_eq!(record.attempts, 1, "the deadline counted: {record:?}");
    let second = receive(&started, Duration::from_secs(10), "the retry").await;
    assert!(
        second.duration_since(first) < BLOCK,
        "the first block is still on"
    );

    shutdown.cancel();
    let stopping = Instant::now();
    let report = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("Worker::run returned within 10 s of the shutdown")
        .unwrap()
        .unwrap();
    let took = stopping.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "returned {took:?} after the shutdown"
    );
    assert!(
        first.elapsed() < BLOCK,
        "both blocks were still on at the return"
    );
    // The retry's own deadline and the shutdown's grace end about together: it is stopped
    // by one or the other.
    assert_eq!(report.timed_out + report.abandoned, 2, "{report:?}");
    assert!(report.timed_out >= 1, "{report:?}");
    let record = store.inspect(&blocks).await.unwrap();
    assert_eq!(record.owner, None, "ended at the shutdown: {record:?}");
    assert_eq!(
        record.attempts, report.timed_out,
        "each deadline counted, the shutdown did not: {record:?}"
    );
}
