//! Scenarios that need faults after the store applied a call (a late reply), or a count of
//! what a worker sends (heartbeats that must have stopped).

use std::sync::Arc;
use std::time::Duration;

use lease_core::LeaseStore;
use lease_runtime::{
    CancelReason, Fault, FaultyStore, Heartbeats, ReplyFault, RunScope, ScopeConfig,
};
use tokio::time::{timeout, Instant};

use crate::scenarios::{created, long, worker};
use crate::scope_scenarios::{assert_stopped_at_deadline_before_expiry, cancelled_within};
use crate::StoreFactory;

/// Waits until `faulty` has seen at least `n` renewals of `scope`'s run.
async fn renewed(faulty: &FaultyStore, scope: &RunScope, n: u64) {
    let waited = timeout(Duration::from_secs(5), async {
        while faulty.renewals_of(scope.run()) < n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "no {n} renewals of {} within 5 s",
        scope.run()
    );
}

/// Once a lease has ended (suspended, completed, released, rejected, or its scope dropped), no
/// renewal of it is sent any more, by a scope's own heartbeat or by a hub. Renewals are counted
/// at the store's door, so a renewal the store would refuse counts too.
pub async fn heartbeats_stop_once_a_lease_ends(factory: &dyn StoreFactory) {
    let inner = factory.fresh().await;
    let t = crate::timing(&*inner);
    let counting = FaultyStore::new(inner.clone());
    let store: Arc<dyn LeaseStore> = Arc::new(counting.clone());
    let interval = Duration::from_millis(40);
    for by_hub in [false, true] {
        let hub = by_hub.then(|| Heartbeats::new(store.clone(), interval).expect("hub"));
        let config = match &hub {
            Some(hub) => ScopeConfig::default().with_heartbeats(hub.clone()),
            None => ScopeConfig::default().with_heartbeat(interval),
        };
        let mode = if by_hub { "hub" } else { "scope" };
        for ending in ["suspend", "complete", "release", "rejection", "drop"] {
            let r = created(&*inner, &format!("{mode}-{ending}")).await;
            let scope = RunScope::claim(
                store.clone(),
                &r,
                &worker("a"),
                t.at_least(3_000),
                config.clone(),
            )
            .await
            .expect("claim");
            renewed(&counting, &scope, 2).await;
            match ending {
                "suspend" => scope.suspend().await.expect("suspend"),
                "complete" => scope.complete().await.expect("complete"),
                "release" => scope.release().await.expect("release"),
                "rejection" => {
                    inner.force_release(&r).await.expect("force release");
                    inner
                        .claim(&r, &worker("b"), long())
                        .await
                        .expect("claim b");
                    let (_, reason) = cancelled_within(&scope, Duration::from_secs(2)).await;
                    assert!(matches!(reason, CancelReason::Rejected(_)), "{reason}");
                }
                _ => drop(scope),
            }
            // A scope serializes its renewals with the calls that end its lease, so once the
            // end returned nothing more may be sent. A hub may have sent a batch just before
            // the end was recorded, and a dropped scope's renewal may be half-way: allow
            // those a few intervals (a loaded machine may run a tick late).
            if by_hub || ending == "drop" {
                tokio::time::sleep(interval * 3).await;
            }
            let settled = counting.renewals_of(&r);
            tokio::time::sleep(interval * 8).await;
            assert_eq!(
                counting.renewals_of(&r),
                settled,
                "{mode}: renewals of {r} kept coming after {ending}"
            );
        }
    }
}

/// A renewal whose reply comes back late (a quarter of the TTL after the store applied it,
/// longer than the margin) moves the local deadline only to its **send** instant + TTL −
/// margin. When the store then goes silent, the scope stops while the store still holds the
/// lease, whose expiry the late renewal set from the instant the store applied it. A deadline
/// taken when the reply arrived would run past the store's expiry by the delay minus the
/// margin, and this scenario would find the store expired at the cancel.
///
/// (A scope gives up on a renewal after one heartbeat interval, and the reply must arrive
/// before the claim's own deadline, so the delay that can still count is below half the TTL.)
pub async fn scope_deadline_counts_from_the_send_instant_of_a_late_renewal(
    factory: &dyn StoreFactory,
) {
    let inner = factory.fresh().await;
    let t = crate::timing(&*inner);
    let r = created(&*inner, "late-reply").await;
    let faulty = FaultyStore::new(inner.clone());
    // Claim at 0 (deadline 1.7 s); renewal sent and applied at 0.6 s (store expiry 2.6 s), its
    // reply arrives at 1.1 s: the deadline becomes 0.6 + 1.7 = 2.3 s, 0.3 s before the store's
    // expiry. Taken at the reply it would be 1.1 + 1.7 = 2.8 s, after it.
    let config = ScopeConfig::default()
        .with_heartbeat(t.scale(Duration::from_millis(600)))
        .with_margin(t.scale(Duration::from_millis(300)));
    let scope = RunScope::claim(
        Arc::new(faulty.clone()) as Arc<dyn LeaseStore>,
        &r,
        &worker("a"),
        t.ttl(2_000),
        config,
    )
    .await
    .expect("claim");
    faulty.set_reply(ReplyFault::Delay(t.scale(Duration::from_millis(500))));
    // Wait until the store has applied the first renewal, then cut the network: the late reply
    // still arrives, later renewals hang.
    let applied = timeout(t.scale(Duration::from_secs(2)), async {
        loop {
            if inner.inspect(&r).await.expect("inspect").heartbeats >= 1 {
                return Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .expect("the first renewal was applied");
    faulty.set(Fault::Hang);
    let (at, reason) = cancelled_within(&scope, t.scale(Duration::from_secs(5))).await;
    let record = inner.inspect(&r).await.expect("inspect");
    assert_eq!(record.heartbeats, 1, "exactly the late renewal was applied");
    assert!(
        scope.renewals() >= 1,
        "the late reply reached the scope before its deadline"
    );
    assert_stopped_at_deadline_before_expiry(at, &reason, applied, &record);
    faulty.set(Fault::Pass);
}
