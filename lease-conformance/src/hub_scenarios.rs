//! Worker-wide heartbeat scenarios: `RunScope`s renewed in batches by one `Heartbeats` hub.

use std::sync::Arc;
use std::time::Duration;

use lease_core::LeaseStore;
use lease_runtime::{Fault, FaultyStore, Heartbeats, RunScope, ScopeConfig};
use tokio::time::{timeout, Instant};

use crate::scenarios::{created, long, worker};
use crate::scope_scenarios::{
    assert_rejected_as_stale, assert_stopped_at_deadline_before_expiry, cancelled_within,
};
use crate::StoreFactory;

/// Waits until the hub has completed `ticks` ticks in total, failing the scenario after `limit`.
async fn ticked(hub: &Heartbeats, ticks: u64, limit: Duration) {
    let waited = timeout(limit, async {
        while hub.stats().ticks < ticks {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "hub did not complete {ticks} ticks within {limit:?}: {:?}",
        hub.stats()
    );
}

/// Claims `n` runs named `{prefix}-{i}` for worker `a`, each in a scope renewed by `hub`.
async fn scopes(
    store: &Arc<dyn LeaseStore>,
    hub: &Heartbeats,
    prefix: &str,
    n: usize,
    ttl: lease_core::Ttl,
    margin: Duration,
) -> Vec<RunScope> {
    let config = ScopeConfig::default()
        .with_heartbeats(hub.clone())
        .with_margin(margin);
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let r = created(&**store, &format!("{prefix}-{i}")).await;
        let scope = RunScope::claim(store.clone(), &r, &worker("a"), ttl, config.clone())
            .await
            .expect("claim");
        out.push(scope);
    }
    out
}

/// In a batch renewal where one lease is stale (someone took its run over), only that run's
/// scope is cancelled, with the stale fence as the reason; the others keep renewing.
pub async fn hub_cancels_only_the_scope_whose_lease_is_stale(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let t = crate::timing(&*store);
    let hub = Heartbeats::new(store.clone(), Duration::from_millis(100)).unwrap();
    let all = scopes(
        &store,
        &hub,
        "batch",
        5,
        t.at_least(3_000),
        Duration::from_millis(300),
    )
    .await;
    assert_eq!(hub.len(), 5);
    ticked(&hub, 1, Duration::from_secs(5)).await;
    let lost = &all[2];
    store.force_release(lost.run()).await.unwrap();
    let b = store.claim(lost.run(), &worker("b"), long()).await.unwrap();
    assert_eq!(b.fence().get(), 2);
    let taken_at = Instant::now();

    let (at, reason) = cancelled_within(lost, Duration::from_secs(2)).await;
    // A tick can fall between the operator's force_release and B's claim (on a store whose
    // calls take tens of milliseconds): then the refusal is "released" under fence 1 instead
    // of the stale fence. Either ends the scope on that tick; nothing else is accepted.
    let released = matches!(
        &reason,
        lease_runtime::CancelReason::Rejected(e) if matches!(
            **e,
            lease_core::Error::LeaseEnded { fence: 1, ended: lease_core::Ended::Released, .. }
        )
    );
    if !released {
        assert_rejected_as_stale(&reason, 1, 2);
    }
    assert!(
        at.duration_since(taken_at) < Duration::from_millis(1_500),
        "cancelled on the next tick, long before the old lease's TTL"
    );

    // The others keep renewing: three more ticks, each renewing exactly the four survivors.
    let before: Vec<u64> = all.iter().map(RunScope::renewals).collect();
    let ticks = hub.stats().ticks;
    ticked(&hub, ticks + 3, Duration::from_secs(5)).await;
    for (i, scope) in all.iter().enumerate() {
        if i == 2 {
            assert_eq!(
                scope.renewals(),
                before[i],
                "a cancelled scope is not renewed"
            );
            continue;
        }
        assert!(!scope.is_cancelled(), "{:?}", scope.cancel_reason());
        assert!(
            scope.renewals() >= before[i] + 2,
            "scope {i} kept renewing: {} then {}",
            before[i],
            scope.renewals()
        );
        let record = store.inspect(scope.run()).await.unwrap();
        assert_eq!(record.owner, Some(worker("a")));
        assert!(
            record.heartbeats >= scope.renewals(),
            "the store counted the renewals: {record:?}"
        );
    }
    let last = hub.last_tick().expect("a tick report");
    assert_eq!(
        (last.leases, last.round_trips, last.renewed, last.rejected),
        (4, 1, 4, 0),
        "one round trip renews the four survivors: {last:?}"
    );
    assert_eq!(hub.len(), 4, "the cancelled scope left the hub");
    // The new holder is untouched by the old holder's heartbeats.
    let record = store.inspect(lost.run()).await.unwrap();
    assert_eq!((record.owner, record.fence.get()), (Some(worker("b")), 2));
    for scope in &all {
        if !scope.is_cancelled() {
            scope.complete().await.unwrap();
        }
    }
    assert!(hub.is_empty(), "completed scopes left the hub");
}

/// A hub whose store hangs (a black-holed network) extends nothing, and every scope is cancelled
/// at its own local deadline while the store still holds its lease, even though the batch call
/// never returns.
pub async fn hub_over_a_hanging_store_cancels_every_scope_at_its_local_deadline(
    factory: &dyn StoreFactory,
) {
    let inner = factory.fresh().await;
    let t = crate::timing(&*inner);
    let faulty = FaultyStore::new(inner.clone());
    let store: Arc<dyn LeaseStore> = Arc::new(faulty.clone());
    let hub = Heartbeats::new(store.clone(), t.scale(Duration::from_millis(200))).unwrap();
    let all = scopes(
        &store,
        &hub,
        "dark",
        4,
        t.ttl(1_500),
        t.scale(Duration::from_millis(400)),
    )
    .await;
    ticked(&hub, 2, t.scale(Duration::from_secs(5))).await;
    assert!(
        all.iter().all(|s| s.renewals() >= 1),
        "renewed before the partition"
    );
    let partitioned_at = Instant::now();
    faulty.set(Fault::Hang);

    for scope in &all {
        timeout(t.scale(Duration::from_secs(5)), scope.cancelled())
            .await
            .unwrap_or_else(|_| panic!("scope not cancelled at its deadline: {scope:?}"));
        let (at, reason) = scope.cancel_reason().expect("a reason");
        // Straight away, ask the store (around the fault) whether the lease is still held.
        let record = inner.inspect(scope.run()).await.unwrap();
        assert_stopped_at_deadline_before_expiry(at, &reason, partitioned_at, &record);
    }
    faulty.set(Fault::Pass);
}

/// A hub holding more than [`MAX_BATCH`](lease_core::MAX_BATCH) leases renews them in chunks of
/// at most that many per round trip, and renews every one.
pub async fn hub_renews_in_chunks_of_at_most_max_batch(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let t = crate::timing(&*store);
    let n = lease_core::MAX_BATCH * 2 + 1;
    for i in 0..n {
        created(&*store, &format!("many-{i:05}")).await;
    }
    // Claiming every run must finish before the first tick: the interval stretches with a
    // store whose operations are timed in seconds.
    let hub = Heartbeats::new(store.clone(), t.scale(Duration::from_millis(500))).unwrap();
    let config = ScopeConfig::default().with_heartbeats(hub.clone());
    let mut all = Vec::with_capacity(n);
    while all.len() < n {
        let max = (n - all.len()).min(lease_core::MAX_BATCH);
        let claimed = RunScope::claim_next(
            store.clone(),
            &worker("a"),
            t.at_least(20_000),
            max,
            config.clone(),
        )
        .await
        .unwrap();
        assert!(!claimed.is_empty(), "every created run is claimable");
        all.extend(claimed);
    }
    assert_eq!(hub.len(), n);
    ticked(&hub, 1, Duration::from_secs(20)).await;
    let last = hub.last_tick().expect("a tick report");
    assert_eq!(
        (
            last.leases,
            last.round_trips,
            last.renewed,
            last.rejected,
            last.failed
        ),
        (n, 3, n, 0, 0),
        "{n} leases in three round trips: {last:?}"
    );
    assert!(all.iter().all(|s| s.renewals() == 1 && !s.is_cancelled()));
    drop(all);
    ticked(&hub, 2, Duration::from_secs(20)).await;
    assert!(hub.is_empty(), "dropped scopes left the hub");
}
