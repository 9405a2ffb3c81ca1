//! Worker-side scenarios: a `RunScope` over each backend, with faults injected in between.

use std::sync::Arc;
use std::time::Duration;

use lease_core::{Error, LeaseStore, RunRecord, RunState};
use lease_runtime::{CancelReason, Fault, FaultyStore, RunScope, ScopeConfig};
use tokio::time::{timeout, Instant};

use crate::scenarios::{created, long, worker};
use crate::StoreFactory;

/// Waits for the scope to cancel, failing the scenario after `limit`.
pub(crate) async fn cancelled_within(scope: &RunScope, limit: Duration) -> (Instant, CancelReason) {
    timeout(limit, scope.cancelled())
        .await
        .unwrap_or_else(|_| panic!("scope not cancelled within {limit:?}: {scope:?}"));
    scope
        .cancel_reason()
        .expect("a cancelled scope has a reason")
}

/// Asserts a scope was cancelled because the store rejected its lease as stale, with both fences.
#[track_caller]
pub(crate) fn assert_rejected_as_stale(reason: &CancelReason, presented: u64, current: u64) {
    match reason {
        CancelReason::Rejected(e) => match **e {
            Error::StaleFence {
                presented: p,
                current: c,
                ..
            } => assert_eq!((p, c), (presented, current), "{e}"),
            ref other => panic!("expected StaleFence {{ {presented}, {current} }}, got {other}"),
        },
        other => panic!("expected the stale fence as the reason, got {other}"),
    }
}

/// Asserts a scope cut off at `partitioned_at` was cancelled at its local deadline (one that
/// came from a renewal before the cut), while `record`, read straight after, shows the store
/// still holding the lease for worker `a`: the worker stopped before anyone could claim the run.
#[track_caller]
pub(crate) fn assert_stopped_at_deadline_before_expiry(
    at: Instant,
    reason: &CancelReason,
    partitioned_at: Instant,
    record: &RunRecord,
) {
    match reason {
        CancelReason::DeadlineExceeded { deadline, .. } => {
            assert!(at >= *deadline, "cancelled at its deadline, not before");
            assert!(
                *deadline > partitioned_at,
                "the deadline came from the last good renewal"
            );
        }
        other => panic!("expected the local deadline as the reason, got {other}"),
    }
    assert_eq!(record.owner, Some(worker("a")));
    let left = record.remaining().unwrap_or_default();
    assert!(
        !record.is_expired() && left > Duration::from_millis(100),
        "the scope must stop before the store's expiry; the store had {left:?} left"
    );
}

/// A scope's heartbeats keep its lease well past one TTL, and the store counts them.
pub async fn scope_heartbeats_keep_a_lease_past_its_ttl(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let ttl = crate::timing(&*store).ttl(300);
    let r = created(&*store, "kept").await;
    let scope = RunScope::claim(store.clone(), &r, &worker("a"), ttl, ScopeConfig::default())
        .await
        .unwrap();
    tokio::time::sleep(ttl.as_duration() * 10 / 3).await; // more than three TTLs
    assert!(!scope.is_cancelled(), "{:?}", scope.cancel_reason());
    assert!(matches!(
        store.claim(&r, &worker("b"), long()).await,
        Err(Error::Held { .. })
    ));
    let record = store.inspect(&r).await.unwrap();
    assert!(record.heartbeats >= 3, "heartbeats every TTL/3: {record:?}");
    assert!(scope.renewals() >= 3);
    scope.complete().await.unwrap();
    assert!(matches!(
        scope.cancel_reason(),
        Some((_, CancelReason::Completed))
    ));
}

/// A scope whose store hangs (a black-holed network) is cancelled by its local deadline, while
/// the store still holds the lease for it: before anyone else could claim the run.
pub async fn scope_over_a_hanging_store_cancels_at_its_local_deadline_before_store_expiry(
    factory: &dyn StoreFactory,
) {
    let inner = factory.fresh().await;
    let t = crate::timing(&*inner);
    let r = created(&*inner, "partitioned").await;
    let faulty = FaultyStore::new(inner.clone());
    let config = ScopeConfig::default()
        .with_heartbeat(t.scale(Duration::from_millis(200)))
        .with_margin(t.scale(Duration::from_millis(400)));
    let scope = RunScope::claim(
        Arc::new(faulty.clone()) as Arc<dyn LeaseStore>,
        &r,
        &worker("a"),
        t.ttl(1_500),
        config,
    )
    .await
    .unwrap();
    tokio::time::sleep(t.scale(Duration::from_millis(500))).await;
    assert!(scope.renewals() >= 1, "heartbeats ran before the partition");
    let partitioned_at = Instant::now();
    faulty.set(Fault::Hang);

    let (at, reason) = cancelled_within(&scope, t.scale(Duration::from_secs(5))).await;
    // Straight away, ask the store (around the fault) whether the lease is still held.
    let record = inner.inspect(&r).await.unwrap();
    let refused = inner.claim(&r, &worker("b"), long()).await;
    assert_stopped_at_deadline_before_expiry(at, &reason, partitioned_at, &record);
    assert!(matches!(refused, Err(Error::Held { .. })), "{refused:?}");
    faulty.set(Fault::Pass);
}

/// A scope whose renewal is rejected (someone took the run over) is cancelled at once, with the
/// store's verdict as the reason.
pub async fn scope_whose_renewal_is_rejected_cancels_with_the_rejection(
    factory: &dyn StoreFactory,
) {
    let store = factory.fresh().await;
    let t = crate::timing(&*store);
    let r = created(&*store, "taken").await;
    let config = ScopeConfig::default().with_heartbeat(Duration::from_millis(100));
    let scope = RunScope::claim(store.clone(), &r, &worker("a"), t.at_least(5_000), config)
        .await
        .unwrap();
    store.force_release(&r).await.unwrap();
    let b = store.claim(&r, &worker("b"), long()).await.unwrap();
    let taken_at = Instant::now();
    assert_eq!(b.fence().get(), 2);

    let (at, reason) = cancelled_within(&scope, Duration::from_secs(2)).await;
    assert_rejected_as_stale(&reason, 1, 2);
    assert!(
        at.duration_since(taken_at) < Duration::from_millis(1_000),
        "cancelled on the next heartbeat, long before the old lease's TTL"
    );
    // The scope does not answer writes itself: the store does, by fence.
    match scope.append(b"after takeover").await {
        Err(Error::StaleFence {
            presented: 1,
            current: 2,
            ..
        }) => {}
        other => panic!("expected StaleFence from the store, got {other:?}"),
    }
}

/// Suspending through the scope stops its heartbeat: the store's counter stays still.
pub async fn scope_suspend_stops_heartbeats(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let t = crate::timing(&*store);
    let r = created(&*store, "parked").await;
    let interval = Duration::from_millis(60);
    let config = ScopeConfig::default().with_heartbeat(interval);
    let scope = RunScope::claim(store.clone(), &r, &worker("a"), t.at_least(600), config)
        .await
        .unwrap();
    tokio::time::sleep(interval * 3).await;
    scope.suspend().await.unwrap();
    assert!(matches!(
        scope.cancel_reason(),
        Some((_, CancelReason::Suspended))
    ));
    let before = store.inspect(&r).await.unwrap();
    assert!(
        before.heartbeats >= 1,
        "heartbeats ran before suspending: {before:?}"
    );
    tokio::time::sleep(interval * 5).await;
    let after = store.inspect(&r).await.unwrap();
    assert_eq!(
        (after.state, after.owner.clone()),
        (RunState::Suspended, None)
    );
    assert_eq!(
        after.heartbeats, before.heartbeats,
        "no heartbeat after suspend"
    );
}

/// A safety margin below the minimum (TTL/20, at least 10 ms) and a heartbeat that leaves no
/// room for a retry before the local deadline (2.25 × heartbeat ≥ TTL − margin) are refused
/// with their own reasons before anything is claimed.
pub async fn scope_timing_without_room_for_a_retry_is_refused(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let t = crate::timing(&*store);
    let r = created(&*store, "timing").await;
    let ttl = t.at_least(1_000);
    let of_ttl = |thousandths: u32| ttl.as_duration() * thousandths / 1_000;
    let claim = |config: ScopeConfig| {
        let (store, r) = (store.clone(), r.clone());
        async move { RunScope::claim(store, &r, &worker("a"), ttl, config).await }
    };
    for margin in [Duration::ZERO, Duration::from_millis(9)] {
        match claim(ScopeConfig::default().with_margin(margin)).await {
            Err(Error::InvalidInput(lease_core::InvalidInput::MarginTooSmall { min, .. })) => {
                assert_eq!(min, ttl.as_duration() / 20, "TTL/20");
            }
            other => panic!("margin {margin:?}: expected MarginTooSmall, got {other:?}"),
        }
    }
    // TTL 1 s, margin 100 ms: the window is 900 ms, so 400 ms leaves no retry; 390 ms does.
    // (For a store whose shortest TTL is longer, all of them in the same proportion.)
    let config = |hb| {
        ScopeConfig::default()
            .with_margin(of_ttl(100))
            .with_heartbeat(of_ttl(hb))
    };
    assert!(matches!(
        claim(config(400)).await,
        Err(Error::InvalidInput(
            lease_core::InvalidInput::ScopeTiming { .. }
        ))
    ));
    let record = store.inspect(&r).await.unwrap();
    assert_eq!(
        record.fence.get(),
        0,
        "a refused configuration claims nothing"
    );
    let scope = claim(config(390))
        .await
        .expect("a heartbeat with room for a retry");
    scope.release().await.unwrap();
}

/// The next renewal is scheduled from the last one's *send*, not its answer: after a slow but
/// successful renewal, a renewal that is lost still leaves time for a retry before the local
/// deadline, and the scope keeps its lease.
pub async fn scope_after_a_slow_renewal_still_has_time_to_retry(factory: &dyn StoreFactory) {
    let inner = factory.fresh().await;
    let t = crate::timing(&*inner);
    let r = created(&*inner, "slow-then-lost").await;
    let faulty = FaultyStore::new(inner.clone());
    // TTL 2 s, margin 200 ms (window 1.8 s), heartbeat 700 ms. Renewal 1 is sent at 0.7 s and
    // answered at 1.2 s. Renewal 2, sent at 1.4 s (0.7 s after renewal 1 was sent), is lost:
    // abandoned at 2.1 s, retried at 2.275 s, before the deadline of 0.7 + 1.8 = 2.5 s.
    // Scheduled from the answer instead, it would go at 1.9 s, be abandoned at 2.6 s and the
    // scope would be cancelled at 2.5 s. (All stretched alike for a store with longer TTLs.)
    let config = ScopeConfig::default()
        .with_heartbeat(t.scale(Duration::from_millis(700)))
        .with_margin(t.scale(Duration::from_millis(200)));
    let started = Instant::now();
    let scope = RunScope::claim(
        Arc::new(faulty.clone()) as Arc<dyn LeaseStore>,
        &r,
        &worker("a"),
        t.ttl(2_000),
        config,
    )
    .await
    .unwrap();
    faulty.set_reply(lease_runtime::ReplyFault::Delay(
        t.scale(Duration::from_millis(500)),
    ));
    // The slow renewal's answer is due at 1.2 s; wait for it until 1.35 s at the latest, so a
    // loaded server's extra milliseconds do not fail the scenario, and still switch to losing
    // replies before renewal 2 is sent at 1.4 s.
    let answered_by = started + t.scale(Duration::from_millis(1_350));
    while scope.renewals() == 0 && Instant::now() < answered_by {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(scope.renewals(), 1, "the slow renewal was answered");
    faulty.set_reply(lease_runtime::ReplyFault::Lose);
    tokio::time::sleep_until(started + t.scale(Duration::from_millis(2_000))).await;
    faulty.set_reply(lease_runtime::ReplyFault::Pass);
    tokio::time::sleep_until(started + t.scale(Duration::from_millis(2_900))).await;
    assert!(
        !scope.is_cancelled(),
        "cancelled: {:?}",
        scope.cancel_reason()
    );
    assert!(scope.renewals() >= 2, "the retry renewed the lease");
    scope.release().await.unwrap();
}

/// A scope's end whose answer was lost (applied, but the caller saw `Unavailable`) is retried
/// by calling it again: the retry recognises its own commit (`LeaseEnded` with the same fence
/// and the same end) and returns `Ok`; a different end after it still gets the verdict.
pub async fn scope_end_retried_after_a_lost_answer_succeeds(factory: &dyn StoreFactory) {
    let inner = factory.fresh().await;
    let faulty = FaultyStore::new(inner.clone());
    let store = Arc::new(faulty.clone()) as Arc<dyn LeaseStore>;
    for (i, end) in ["complete", "suspend", "release"].into_iter().enumerate() {
        let r = created(&*inner, &format!("lost-{end}")).await;
        let scope = RunScope::claim(
            store.clone(),
            &r,
            &worker("a"),
            long(),
            ScopeConfig::default(),
        )
        .await
        .unwrap();

        faulty.set_reply(lease_runtime::ReplyFault::Error);
        let first = end_by(&scope, i).await;
        assert!(
            matches!(first, Err(Error::Unavailable { .. })),
            "{end}: the answer was lost: {first:?}"
        );
        faulty.set_reply(lease_runtime::ReplyFault::Pass);
        let want = [RunState::Completed, RunState::Suspended, RunState::Runnable][i];
        let record = inner.inspect(&r).await.unwrap();
        assert_eq!(
            (record.state, record.owner),
            (want, None),
            "{end} was applied"
        );
        end_by(&scope, i)
            .await
            .unwrap_or_else(|e| panic!("{end}: the retry must recognise its own commit: {e}"));
        assert!(scope.is_cancelled(), "{end}: the scope ended");
        if i == 0 {
            // Another end after the completion is a verdict, not a success.
            match scope.suspend().await {
                Err(Error::LeaseEnded {
                    fence: 1,
                    ended: lease_core::Ended::Completed,
                    ..
                }) => {}
                other => panic!("suspend after complete: {other:?}"),
            }
        }
    }
}

async fn end_by(scope: &RunScope, i: usize) -> lease_core::Result<()> {
    match i {
        0 => scope.complete().await,
        1 => scope.suspend().await,
        _ => scope.release().await,
    }
}
