//! A store that waits for replicas, whose replica a test cuts off: nothing may be reported
//! done that the promoted replica does not hold, a retry's "already ended under your fence"
//! included. The scenario is backend-neutral; the test brings the servers, the cut and the
//! promotion (`lease-redis/tests/topology/acked.rs`, `lease-postgres/tests/acknowledged.rs`).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lease_core::{End, Fence, Lease, LeaseStore, RunId, RunState, Ttl, WorkerId};
use lease_runtime::{
    CancellationToken, RunContext, RunScope, ScopeConfig, Worker, WorkerConfig, WorkerReport,
};
use tokio::sync::Notify;

/// What [`ends_across_a_cut`] saw, to be checked against the promoted replica with
/// [`assert_nothing_committed_was_lost`].
#[derive(Debug)]
pub struct EndsAcrossACut {
    /// Every end the `Worker` reported: run, fence, whether it was reported committed.
    pub ends: Vec<(RunId, Fence, bool)>,
    /// The Worker's totals.
    pub report: WorkerReport,
    /// Leases claimed before the cut whose `complete` (direct, and through a scope) was
    /// refused twice during it: run and fence.
    pub refused: Vec<(RunId, Fence)>,
}

fn id(s: &str) -> RunId {
    RunId::new(s).expect("a valid run id")
}

fn worker(s: &str) -> WorkerId {
    WorkerId::new(s).expect("a valid worker id")
}

/// `op`, tried again while it fails retryably (a replica still settling after its sync) for
/// up to 10 s: the set-up before the cut must succeed.
async fn settled<T, F, Fut>(what: &str, mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = lease_core::Result<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match op().await {
            Ok(value) => return value,
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("{what} before the cut: {e:?}"),
        }
    }
}

/// Before the cut: claims `direct` and `scoped` (acknowledged by the replica), and has a
/// `Worker` complete `before` (the control, reported committed). Then `cut` cuts the
/// replica's link (and proves it is cut) while the Worker's job `during` waits, and that job
/// completes: its end cannot be acknowledged, nor can the retries that answer "already
/// completed under your fence". During the cut `complete` of `direct` is called and retried,
/// and the scope's `complete` too: each must fail as retryable (asserted). Returns what was
/// reported, with the cut's guard (keep it until the primary is gone), or `None` if `cut`
/// could not cut (the fixtures' skip).
///
/// # Panics
/// When the store or the Worker does not behave as described.
pub async fn ends_across_a_cut<C, Fut>(
    store: Arc<dyn LeaseStore>,
    backend: &str,
    cut: impl FnOnce() -> Fut,
) -> Option<(EndsAcrossACut, C)>
where
    Fut: Future<Output = Option<C>>,
{
    let ttl = |ms| Ttl::from_millis(ms).expect("a valid TTL");
    let (direct, scoped) = (id("direct"), id("scoped"));
    let both = [direct.clone(), scoped.clone()];
    let (d, s) = (worker("d"), worker("s"));
    settled("create", || store.create_many(&both)).await;
    let direct_lease: Lease =
        settled("claim direct", || store.claim(&direct, &d, ttl(60_000))).await;
    let scope = settled("claim scoped", || {
        RunScope::claim(
            store.clone(),
            &scoped,
            &s,
            ttl(60_000),
            ScopeConfig::default(),
        )
    })
    .await;

    let cut_made = Arc::new(Notify::new());
    let started = Arc::new(Notify::new());
    type Seen = Arc<Mutex<Vec<(RunId, Fence, bool)>>>;
    let ends: Seen = Arc::default();
    let seen = ends.clone();
    let pool = Worker::new(
        store.clone(),
        worker("w"),
        WorkerConfig::new(ttl(3_000))
            .with_concurrency(2)
            .with_poll_interval(Duration::from_millis(20))
            .with_batch(10, Duration::from_millis(5))
            .with_grace(Duration::from_secs(1)),
    )
    .expect("a valid worker")
    .on_end(move |report| {
        seen.lock().expect("not poisoned").push((
            report.lease.run().clone(),
            report.lease.fence(),
            report.result.is_ok(),
        ));
    });
    let handler = {
        let (cut_made, started) = (cut_made.clone(), started.clone());
        move |ctx: RunContext| {
            let (cut_made, started) = (cut_made.clone(), started.clone());
            async move {
                if ctx.run().as_str() == "during" {
                    started.notify_one();
                    cut_made.notified().await;
                }
                Ok(End::CompleteWith(
                    format!("effect of {}", ctx.run()).into_bytes(),
                ))
            }
        }
    };
    let shutdown = CancellationToken::new();
    let running = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move { pool.run(handler, shutdown).await })
    };
    let reported = |name: &str| {
        ends.lock()
            .expect("not poisoned")
            .iter()
            .any(|(r, _, _)| r.as_str() == name)
    };
    let before = id("before");
    settled("create before", || store.create(&before)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !reported("before") {
        assert!(Instant::now() < deadline, "'before' was never reported");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let during = id("during");
    settled("create during", || store.create(&during)).await;
    tokio::time::timeout(Duration::from_secs(10), started.notified())
        .await
        .expect("the worker started 'during'");

    let guard = cut().await?;
    cut_made.notify_one();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !reported("during") {
        assert!(Instant::now() < deadline, "'during' was never reported");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let first = store.complete(&direct_lease).await.unwrap_err();
    crate::assert_unavailable(&first, backend);
    let retried = store.complete(&direct_lease).await.unwrap_err();
    assert!(
        retried.is_retryable(),
        "a retry's 'already completed' must wait for the replica too, got {retried:?}"
    );
    let first = scope.complete().await.unwrap_err();
    crate::assert_unavailable(&first, backend);
    let retried = scope.complete().await;
    assert!(
        matches!(&retried, Err(e) if e.is_retryable()),
        "the scope's retried complete reported {retried:?} without the replica"
    );

    shutdown.cancel();
    let report = tokio::time::timeout(Duration::from_secs(20), running)
        .await
        .expect("the worker stops")
        .expect("the worker task")
        .expect("a worker report");
    let ends = ends.lock().expect("not poisoned").clone();
    let refused = vec![(direct, direct_lease.fence()), (scoped, scope.fence())];
    Some((
        EndsAcrossACut {
            ends,
            report,
            refused,
        },
        guard,
    ))
}

/// Checks `seen` against the promoted replica: every end reported committed is `Completed`
/// there, the control was committed, the end made during the cut was not, and the leases whose
/// `complete` was refused are still at their fence. Returns one line saying what was seen.
///
/// # Panics
/// When a committed end is missing, or the scenario did not run as designed.
pub async fn assert_nothing_committed_was_lost(
    seen: &EndsAcrossACut,
    promoted: &dyn LeaseStore,
) -> String {
    let mut lines = Vec::new();
    for (run, fence, committed) in &seen.ends {
        let record = promoted
            .inspect(run)
            .await
            .expect("inspect on the promoted replica");
        lines.push(format!(
            "{run}: reported {} under fence {fence}; promoted: {} at fence {}",
            if *committed {
                "committed"
            } else {
                "not committed"
            },
            record.state,
            record.fence
        ));
        if *committed {
            assert_eq!(
                record.state,
                RunState::Completed,
                "{run} was reported committed but the promoted replica has {record:?}"
            );
        }
    }
    for (run, fence) in &seen.refused {
        let record = promoted
            .inspect(run)
            .await
            .expect("inspect on the promoted replica");
        assert_eq!(record.fence, *fence, "{run}");
        lines.push(format!(
            "{run}: complete refused twice; promoted: {} at fence {}",
            record.state, record.fence
        ));
    }
    assert!(
        seen.ends
            .iter()
            .any(|(r, _, ok)| r.as_str() == "before" && *ok),
        "the control job before the cut was committed: {:?}",
        seen.ends
    );
    assert!(
        seen.ends
            .iter()
            .any(|(r, _, ok)| r.as_str() == "during" && !*ok),
        "the job ended during the cut cannot have been confirmed: {:?}",
        seen.ends
    );
    format!("{}; worker {:?}", lines.join("; "), seen.report)
}
