//! The metrics the library reports, read back through a debugging recorder.

use std::sync::Arc;
use std::time::Duration;

use lease_core::{LeaseStore, RunId, Ttl, WorkerId};
use lease_runtime::observe::{
    EMPTY_CLAIMS, LEASES_HELD, RENEWAL_TIME_LEFT, SCOPE_CANCELLATIONS, STALE_WRITES_REFUSED,
    STORE_OPERATIONS, VERDICTS,
};
use lease_runtime::{Fault, FaultyStore, Instrumented, MemoryLeaseStore, RunScope, ScopeConfig};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

type Snapshot = Vec<(
    metrics_util::CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
)>;

/// The value of series `name` whose labels include every pair of `labels`.
fn value<'a>(
    snapshot: &'a Snapshot,
    name: &str,
    labels: &[(&str, &str)],
) -> Option<&'a DebugValue> {
    snapshot
        .iter()
        .find(|(key, _, _, _)| {
            key.key().name() == name
                && labels
                    .iter()
                    .all(|(k, v)| key.key().labels().any(|l| l.key() == *k && l.value() == *v))
        })
        .map(|(_, _, _, value)| value)
}

fn counter(snapshot: &Snapshot, name: &str, labels: &[(&str, &str)]) -> u64 {
    match value(snapshot, name, labels) {
        Some(DebugValue::Counter(n)) => *n,
        None => 0,
        Some(other) => panic!("{name} is not a counter: {other:?}"),
    }
}

/// A stale write, a lost lease and an empty claim show up as the documented series, labelled
/// by reason and backend, never by run id.
#[test]
fn stale_writes_lost_leases_and_empty_claims_are_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let snapshot: Snapshot = metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let memory: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
            let faulty = Arc::new(FaultyStore::new(memory.clone()));
            let store = Instrumented::wrap(faulty.clone(), "memory");
            let run = RunId::new("order-1").unwrap();
            store.create(&run).await.unwrap();
            let a = WorkerId::new("a").unwrap();
            let other = RunId::new("order-2").unwrap();
            store.create(&other).await.unwrap();
            let kept = RunScope::claim(
                memory.clone(),
                &other,
                &a,
                Ttl::from_secs(30).unwrap(),
                ScopeConfig::default(),
            )
            .await
            .unwrap();
            let config = ScopeConfig::default().with_heartbeat(Duration::from_millis(40));
            let ttl = Ttl::from_millis(200).unwrap();
            let scope = RunScope::claim(store.clone(), &run, &a, ttl, config)
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(120)).await; // renewals succeed
            faulty.set(Fault::Hang); // partitioned: the scope cancels at its local deadline
            scope.cancelled().await;
            faulty.set(Fault::Pass);
            tokio::time::sleep(Duration::from_millis(150)).await;
            let b = store
                .claim(
                    &run,
                    &WorkerId::new("b").unwrap(),
                    Ttl::from_secs(30).unwrap(),
                )
                .await
                .unwrap();
            assert_eq!(b.fence().get(), 2);
            let late = store.append(&scope.lease(), b"charge").await;
            assert!(matches!(late, Err(lease_core::Error::StaleFence { .. })));
            drop(scope);
            let none = store
                .claim_next(&WorkerId::new("c").unwrap(), Ttl::from_secs(30).unwrap(), 5)
                .await
                .unwrap();
            assert!(none.is_empty());
            // `kept` is still held when the snapshot is taken.
            let snapshot = snapshotter.snapshot().into_vec();
            drop(kept);
            snapshot
        })
    });
    assert_eq!(counter(&snapshot, STALE_WRITES_REFUSED, &[]), 1);
    let stale = [("backend", "memory"), ("reason", "stale_fence")];
    assert_eq!(counter(&snapshot, VERDICTS, &stale), 1);
    let append = [
        ("backend", "memory"),
        ("operation", "append"),
        ("outcome", "stale_fence"),
    ];
    assert_eq!(counter(&snapshot, STORE_OPERATIONS, &append), 1);
    let deadline = [("reason", "deadline")];
    assert_eq!(counter(&snapshot, SCOPE_CANCELLATIONS, &deadline), 1);
    assert_eq!(
        counter(&snapshot, EMPTY_CLAIMS, &[("backend", "memory")]),
        1
    );
    assert!(matches!(
        value(&snapshot, RENEWAL_TIME_LEFT, &[]),
        Some(DebugValue::Histogram(h)) if !h.is_empty()
    ));
    assert!(matches!(
        value(&snapshot, LEASES_HELD, &[]),
        Some(DebugValue::Gauge(g)) if g.into_inner() == 1.0
    ));
    for (key, _, _, _) in &snapshot {
        for label in key.key().labels() {
            assert!(
                !label.value().contains("order-1") && label.key() != "run",
                "a run id in a label: {key:?}"
            );
        }
    }
}

#[allow(dead_code)]
mod common;

fn gauge(snapshot: &Snapshot, state: &str) -> Option<f64> {
    match value(snapshot, lease_runtime::observe::RUNS, &[("state", state)]) {
        Some(DebugValue::Gauge(g)) => Some(g.into_inner()),
        None => None,
        Some(other) => panic!("lease_runs is not a gauge: {other:?}"),
    }
}

fn kind_gauge(snapshot: &Snapshot, kind: &str, state: &str) -> Option<f64> {
    let labels = [("kind", kind), ("state", state)];
    match value(snapshot, lease_runtime::observe::KIND_RUNS, &labels) {
        Some(DebugValue::Gauge(g)) => Some(g.into_inner()),
        None => None,
        Some(other) => panic!("lease_kind_runs is not a gauge: {other:?}"),
    }
}

/// `spawn_counts` sets the runs gauge and the per-kind gauges at once and again every period
/// (a kind that emptied falls to 0), stops when its handle is dropped, and ends by itself on
/// a store that cannot count.
#[test]
fn spawn_counts_keeps_the_runs_gauge_fresh_until_dropped() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
            let w = WorkerId::new("w").unwrap();
            for id in ["a", "b", "c"] {
                store.create(&RunId::new(id).unwrap()).await.unwrap();
            }
            let email = lease_core::Kind::new("email").unwrap();
            let mail = RunId::new("m").unwrap();
            store
                .create_with(&lease_core::NewRun::new(mail.clone()).with_kind(email.clone()))
                .await
                .unwrap();
            let lease = store
                .claim(&RunId::new("a").unwrap(), &w, Ttl::from_secs(30).unwrap())
                .await
                .unwrap();
            store.complete(&lease).await.unwrap();

            let refresher =
                lease_runtime::observe::spawn_counts(store.clone(), Duration::from_secs(1));
            tokio::time::sleep(Duration::from_millis(200)).await;
            let now: Snapshot = snapshotter.snapshot().into_vec();
            assert_eq!(
                gauge(&now, "claimable"),
                Some(3.0),
                "set at once: b, c and m"
            );
            assert_eq!(gauge(&now, "completed"), Some(1.0));
            assert_eq!(gauge(&now, "cancelled"), Some(0.0));
            match value(&now, lease_runtime::observe::QUEUE_LAG, &[]) {
                Some(DebugValue::Gauge(lag)) => {
                    let lag = lag.into_inner();
                    assert!(
                        lag > 0.0 && lag < 10.0,
                        "b and c have waited since their create: {lag}"
                    );
                }
                other => panic!("no queue lag gauge: {other:?}"),
            }
            assert_eq!(kind_gauge(&now, "default", "claimable"), Some(2.0));
            assert_eq!(kind_gauge(&now, "email", "runnable"), Some(1.0));
            assert!(matches!(
                value(&now, lease_runtime::observe::KIND_QUEUE_LAG, &[("kind", "email")]),
                Some(DebugValue::Gauge(lag)) if lag.into_inner() > 0.0
            ));
            // The email run ends: its kind's gauges fall to 0 at the next period.
            let lease = store
                .claim_next_kind(&email, &w, Ttl::from_secs(30).unwrap(), 1)
                .await
                .unwrap();
            store.complete(&lease[0]).await.unwrap();

            let lease = store
                .claim(&RunId::new("b").unwrap(), &w, Ttl::from_secs(30).unwrap())
                .await
                .unwrap();
            store.complete(&lease).await.unwrap();
            tokio::time::sleep(Duration::from_millis(1_300)).await;
            let now: Snapshot = snapshotter.snapshot().into_vec();
            assert_eq!(
                gauge(&now, "claimable"),
                Some(1.0),
                "refreshed after a period"
            );
            assert_eq!(gauge(&now, "completed"), Some(3.0));
            assert_eq!(kind_gauge(&now, "email", "runnable"), Some(0.0), "emptied");
            assert_eq!(kind_gauge(&now, "email", "claimable"), Some(0.0));

            drop(refresher);
            let lease = store
                .claim(&RunId::new("c").unwrap(), &w, Ttl::from_secs(30).unwrap())
                .await
                .unwrap();
            store.complete(&lease).await.unwrap();
            tokio::time::sleep(Duration::from_millis(1_300)).await;
            let now: Snapshot = snapshotter.snapshot().into_vec();
            // (The debugging recorder's snapshot resets what it read; a refresh would have set
            // the 4 completed runs the store now has.)
            assert_ne!(
                gauge(&now, "completed"),
                Some(4.0),
                "refreshed after it was dropped"
            );
            assert_eq!(store.count().await.unwrap().completed, 4);

            // A store with only the required calls cannot count: the task ends by itself.
            let plain: Arc<dyn LeaseStore> = common::gated(|_| None);
            let refresher = lease_runtime::observe::spawn_counts(plain, Duration::from_secs(1));
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(
                refresher.is_finished(),
                "a store that cannot count ends the refresh"
            );
        });
    });
}

/// A worker records, for each run it completes, the attempt that completed it: 1 for a run
/// done at once, 2 for one whose first attempt failed; and, for each run it claims, how long
/// the run had been claimable.
#[test]
fn completions_record_their_attempt() {
    use lease_core::{End, RunState};
    use lease_runtime::{RetryPolicy, RunContext, Worker, WorkerConfig};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
            for id in ["steady", "flaky"] {
                store.create(&RunId::new(id).unwrap()).await.unwrap();
            }
            let config = WorkerConfig::new(Ttl::from_secs(30).unwrap()).with_retry(
                RetryPolicy::default()
                    .with_backoff(Duration::from_millis(10), Duration::from_millis(10)),
            );
            let worker = Worker::new(store.clone(), WorkerId::new("w").unwrap(), config).unwrap();
            let shutdown = lease_runtime::CancellationToken::new();
            let stop = shutdown.clone();
            let watcher = store.clone();
            let run = tokio::spawn(async move {
                worker
                    .run(
                        |ctx: RunContext| async move {
                            if ctx.run().as_str() == "flaky" && ctx.lease().attempt() == 1 {
                                return Err("the first attempt fails".into());
                            }
                            Ok::<_, lease_core::BoxError>(End::Complete)
                        },
                        stop,
                    )
                    .await
            });
            let t0 = std::time::Instant::now();
            while watcher.count().await.unwrap().completed < 2 {
                assert!(t0.elapsed() < Duration::from_secs(5), "both runs completed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            shutdown.cancel();
            run.await.unwrap().unwrap();
            let flaky = watcher
                .inspect(&RunId::new("flaky").unwrap())
                .await
                .unwrap();
            assert_eq!(flaky.state, RunState::Completed);
            let outcomes: Vec<_> = flaky.history.unwrap().iter().map(|a| a.outcome).collect();
            use lease_core::AttemptOutcome::{Completed, Retried};
            assert_eq!(outcomes, [Retried, Completed], "the flaky run's attempts");
        });
    });
    let snapshot: Snapshot = snapshotter.snapshot().into_vec();
    match value(
        &snapshot,
        lease_runtime::observe::ATTEMPTS_PER_COMPLETION,
        &[],
    ) {
        Some(DebugValue::Histogram(values)) => {
            let mut got: Vec<f64> = values.iter().map(|v| v.into_inner()).collect();
            got.sort_by(f64::total_cmp);
            assert_eq!(got, vec![1.0, 2.0]);
        }
        other => panic!("no attempts histogram: {other:?}"),
    }
    // Three claims (steady, flaky, flaky again after its backoff), each with how long its run
    // had been claimable.
    let wait = value(
        &snapshot,
        lease_runtime::observe::WORKER_WAIT,
        &[("kind", "default")],
    );
    match wait {
        Some(DebugValue::Histogram(values)) => {
            let got: Vec<f64> = values.iter().map(|v| v.into_inner()).collect();
            assert_eq!(got.len(), 3, "{got:?}");
            assert!(got.iter().all(|s| (0.0..5.0).contains(s)), "{got:?}");
        }
        other => panic!("no wait histogram: {other:?}"),
    }
}
