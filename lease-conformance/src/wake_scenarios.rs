//! Wake-ups: a store that sends them wakes its idle workers whenever a run becomes claimable,
//! whoever's write made it so, and a worker woken claims at once rather than at its poll.

use std::sync::Arc;
use std::time::Duration;

use lease_core::{End, Kind, LeaseStore, LeaseStoreExt, NewRun, WakeReceiver};
use lease_runtime::{CancellationToken, Kinds, RunContext, Worker, WorkerConfig, WorkerReport};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{timeout, Instant};

use crate::scenarios::{run, worker};
use crate::StoreFactory;

/// Starts a `Worker` on `store` whose handler sends each run it starts, with the instant, on
/// `started`, and completes it; it runs until `shutdown`. For the measurements of how soon a
/// run is picked up (the adapters' wake-up tests, `lease-bench --parts pickup`).
///
/// # Errors
/// As [`Worker::new`].
pub fn spawn_reporting_worker(
    store: Arc<dyn LeaseStore>,
    id: lease_core::WorkerId,
    config: WorkerConfig,
    started: mpsc::UnboundedSender<(lease_core::RunId, Instant)>,
    shutdown: CancellationToken,
) -> Result<JoinHandle<lease_core::Result<WorkerReport>>, lease_core::InvalidInput> {
    let worker = Worker::new(store, id, config)?;
    let handler = move |ctx: RunContext| {
        let started = started.clone();
        async move {
            let _ = started.send((ctx.run().clone(), Instant::now()));
            Ok(End::Complete)
        }
    };
    Ok(tokio::spawn(
        async move { worker.run(handler, shutdown).await },
    ))
}

/// How long a wake-up may take to arrive; far below the fallback polls the scenarios set.
const ARRIVES_WITHIN: Duration = Duration::from_secs(5);

async fn woken(rx: &mut WakeReceiver, kind: &Kind, what: &str) {
    timeout(ARRIVES_WITHIN, rx.woken(std::slice::from_ref(kind)))
        .await
        .unwrap_or_else(|_| panic!("no wake-up for {kind} within {ARRIVES_WITHIN:?} after {what}"));
}

/// Waits until `rx`'s store listener is connected (its first wake-up, for every kind, is
/// queued by then).
async fn until_live(rx: &WakeReceiver, store: &dyn LeaseStore) {
    let deadline = Instant::now() + ARRIVES_WITHIN;
    while !rx.is_live() {
        assert!(
            Instant::now() < deadline,
            "{store}'s wake-ups not live within {ARRIVES_WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Nothing (for `kind`) arrives within `quiet`.
async fn not_woken(rx: &mut WakeReceiver, kind: &Kind, quiet: Duration, what: &str) {
    let got = timeout(quiet, rx.woken(std::slice::from_ref(kind))).await;
    assert!(
        got.is_err(),
        "a wake-up for {kind} came within {quiet:?} of {what}"
    );
}

/// A store declaring wake-ups sends one for its kind when a run is created, released, given
/// back with a retry delay (when the delay ends, not before), resumed and force-released; none
/// for a run of another kind. A store without them says so (`None`).
pub async fn wake_ups_come_when_a_run_becomes_claimable(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let Some(wakes) = store.wakes() else {
        assert!(
            !store.capabilities().wake_ups,
            "{store} declares wake-ups and sends none"
        );
        return;
    };
    assert!(
        store.capabilities().wake_ups,
        "{store} sends wake-ups it does not declare"
    );
    let t = crate::timing(&*store);
    let kind = Kind::new("woken").unwrap();
    let other = Kind::new("elsewhere").unwrap();
    let mut rx = wakes.subscribe();
    // The store's listener connects; its first wake-up (for every kind) is queued by then.
    until_live(&rx, &*store).await;
    rx.clear();

    let ttl = t.at_least(60_000);
    let id = run("waker");
    store
        .create_with(&NewRun::new(id.clone()).with_kind(kind.clone()))
        .await
        .unwrap();
    woken(&mut rx, &kind, "a create").await;

    // A store that times delays coarsely (etcd: whole-second leases) makes the run claimable
    // up to its declared expiry lag after the delay's end, which the wake-up names.
    let lag = t.capabilities().max_expiry_lag;
    let claim = |store: Arc<dyn LeaseStore>, kind: Kind| async move {
        let deadline = Instant::now() + lag;
        loop {
            let mut leases = store
                .claim_next_kind(&kind, &worker("w"), ttl, 1)
                .await
                .unwrap();
            if leases.len() == 1 {
                return leases.remove(0);
            }
            assert!(
                Instant::now() < deadline,
                "the run is not claimable {lag:?} after its wake-up"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let lease = claim(store.clone(), kind.clone()).await;
    rx.clear();
    store.release(&lease).await.unwrap();
    woken(&mut rx, &kind, "a release").await;

    let lease = claim(store.clone(), kind.clone()).await;
    rx.clear();
    let delay = Duration::from_millis(1_500);
    let sent = Instant::now();
    store.retry_after(&lease, delay).await.unwrap();
    not_woken(&mut rx, &kind, delay / 2, "a retry delay of 1.5 s").await;
    woken(&mut rx, &kind, "the end of a retry delay").await;
    assert!(
        sent.elapsed() >= delay,
        "woken {:?} into a retry delay of {delay:?}",
        sent.elapsed()
    );

    let lease = claim(store.clone(), kind.clone()).await;
    store.suspend(&lease).await.unwrap();
    rx.clear();
    store.resume(&id).await.unwrap();
    woken(&mut rx, &kind, "a resume").await;

    let _held = claim(store.clone(), kind.clone()).await;
    rx.clear();
    store.force_release(&id).await.unwrap();
    woken(&mut rx, &kind, "a force-release").await;

    rx.clear();
    store
        .create_with(&NewRun::new(run("other")).with_kind(other.clone()))
        .await
        .unwrap();
    not_woken(
        &mut rx,
        &kind,
        Duration::from_millis(500),
        "a create of another kind",
    )
    .await;
}

/// An idle worker on a store with wake-ups, polling only every minute, runs a run created
/// after it went idle within seconds, and a run released by another client as fast: it was
/// woken, not polled. A store without wake-ups must not declare them (its workers poll, as
/// every scenario running a `Worker` on it shows), and one with them must declare them.
pub async fn an_idle_worker_is_woken_by_a_new_run_not_by_its_poll(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let declared = store.capabilities().wake_ups;
    let Some(wakes) = store.wakes() else {
        assert!(!declared, "{store} declares wake-ups and sends none");
        return;
    };
    assert!(declared, "{store} sends wake-ups it does not declare");
    let probe = wakes.subscribe();
    let t = crate::timing(&*store);
    let kind = Kind::new("prompt").unwrap();
    let poll = Duration::from_secs(60);
    let config = WorkerConfig::new(t.at_least(30_000)).with_wake_poll_interval(poll);
    let (tx, mut started) = mpsc::unbounded_channel();
    let kinds = Kinds::new().handle(kind.clone(), move |ctx: RunContext| {
        let tx = tx.clone();
        async move {
            let _ = tx.send((ctx.run().clone(), Instant::now()));
            Ok(End::Complete)
        }
    });
    let worker = Worker::new(store.clone(), worker("idle"), config).unwrap();
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let handle = tokio::spawn(async move { worker.run_kinds(kinds, stop).await });
    // The listener connects; then the worker's first claims find nothing and it waits.
    until_live(&probe, &*store).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    for i in 0..3 {
        let id = run(&format!("prompt-{i}"));
        let created = Instant::now();
        store
            .create_with(&NewRun::new(id.clone()).with_kind(kind.clone()))
            .await
            .unwrap();
        let (ran, at) = timeout(ARRIVES_WITHIN, started.recv())
            .await
            .unwrap_or_else(|_| {
                panic!("{id} not run within {ARRIVES_WITHIN:?} (the poll is {poll:?})")
            })
            .unwrap();
        assert_eq!(ran, id);
        assert!(at - created < ARRIVES_WITHIN);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    shutdown.cancel();
    let report = handle.await.unwrap().unwrap();
    assert_eq!(report.completed, 3, "{report:?}");
    assert!(
        report.wake_ups >= 3,
        "the runs were not found by wake-ups: {report:?}"
    );
}

/// Resuming a queue wakes the idle workers of the kinds that have runs waiting in it, so a
/// worker asleep until its fallback poll claims them at once; a store without queues or
/// without wake-ups says so.
pub async fn resuming_a_queue_wakes_the_workers_of_its_kinds(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let (Some(wakes), true) = (store.wakes(), store.capabilities().queues) else {
        return;
    };
    let mail = lease_core::Queue::new("mail").unwrap();
    let (kind, urgent) = (Kind::new("letters").unwrap(), Kind::new("urgent").unwrap());
    store.pause_queue(&mail).await.unwrap();
    for (id, kind, priority) in [("l1", &kind, 0), ("u1", &urgent, 7)] {
        let new = NewRun::new(run(id))
            .with_kind(kind.clone())
            .with_queue(mail.clone())
            .with_priority(priority);
        store.create_with(&new).await.unwrap();
    }
    let mut rx = wakes.subscribe();
    until_live(&rx, &*store).await;
    rx.clear();
    store.resume_queue(&mail).await.unwrap();
    woken(&mut rx, &kind, "a resume of its queue").await;
    rx.clear();
    store.pause_queue(&mail).await.unwrap();
    store.resume_queue(&mail).await.unwrap();
    woken(&mut rx, &urgent, "a resume of its queue").await;
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use lease_core::LeaseStore;
    use lease_runtime::MemoryLeaseStore;

    use crate::{Capabilities, StoreFactory};
    use lease_core::forward::Forward;

    /// The memory store, which sends wake-ups, behind a wrapper that says it sends none.
    #[derive(Debug)]
    struct Undeclared(MemoryLeaseStore);

    impl std::fmt::Display for Undeclared {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "undeclared({})", self.0)
        }
    }

    #[async_trait::async_trait]
    impl Forward for Undeclared {
        fn inner(&self) -> &dyn LeaseStore {
            &self.0
        }

        fn capabilities_over(&self, inner: Capabilities) -> Capabilities {
            inner.without_wake_ups()
        }
    }

    struct Factory;

    #[async_trait::async_trait]
    impl StoreFactory for Factory {
        async fn fresh(&self) -> Arc<dyn LeaseStore> {
            Arc::new(Undeclared(MemoryLeaseStore::new()))
        }
    }

    /// The scenario holds the store's wake-ups to its own word, rather than passing whatever
    /// it declares.
    #[tokio::test]
    #[should_panic(expected = "sends wake-ups it does not declare")]
    async fn the_idle_worker_scenario_checks_the_declared_capability() {
        super::an_idle_worker_is_woken_by_a_new_run_not_by_its_poll(&Factory).await;
    }
}
