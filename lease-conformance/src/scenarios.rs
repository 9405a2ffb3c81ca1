//! Store-level scenarios: the rules of the `LeaseStore` contract, one function each (where each
//! rule lives: ARCHITECTURE.md).

use std::collections::HashSet;
use std::time::Duration;

use lease_core::{
    Ended, Error, Fence, InvalidInput, Lease, LeaseStore, RunId, RunState, Ttl, WorkerId, MAX_BATCH,
};

use crate::StoreFactory;

pub(crate) fn run(id: &str) -> RunId {
    RunId::new(id).expect("valid run id")
}

pub(crate) fn worker(id: &str) -> WorkerId {
    WorkerId::new(id).expect("valid worker id")
}

pub(crate) fn ttl_ms(ms: u64) -> Ttl {
    Ttl::from_millis(ms).expect("valid ttl")
}

/// A TTL no scenario outlives.
pub(crate) fn long() -> Ttl {
    ttl_ms(60_000)
}

pub(crate) async fn created(store: &dyn LeaseStore, id: &str) -> RunId {
    let id = run(id);
    store.create(&id).await.expect("create");
    id
}

/// Asserts a fenced write was rejected as stale, with both fences.
#[track_caller]
pub(crate) fn assert_stale<T: std::fmt::Debug>(
    result: lease_core::Result<T>,
    presented: u64,
    current: u64,
) {
    match result {
        Err(Error::StaleFence {
            presented: p,
            current: c,
            ..
        }) => assert_eq!((p, c), (presented, current), "fences of the rejection"),
        other => panic!(
            "expected StaleFence {{ presented: {presented}, current: {current} }}, got {other:?}"
        ),
    }
}

/// Asserts a fenced write was rejected because its lease ended `how`.
#[track_caller]
pub(crate) fn assert_ended<T: std::fmt::Debug>(
    result: lease_core::Result<T>,
    fence: u64,
    how: Ended,
) {
    match result {
        Err(Error::LeaseEnded {
            fence: f, ended, ..
        }) => assert_eq!((f, ended), (fence, how)),
        other => panic!("expected LeaseEnded {{ fence: {fence}, ended: {how} }}, got {other:?}"),
    }
}

/// Claiming a fresh run returns fence 1 with the claimant as owner, and the record shows it held.
pub async fn claim_of_a_fresh_run_returns_fence_one(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let r = created(&*store, "fresh").await;
    let before = store.inspect(&r).await.unwrap();
    assert_eq!(
        (
            before.state,
            before.fence,
            before.owner.clone(),
            before.heartbeats
        ),
        (RunState::Runnable, Fence::ZERO, None, 0)
    );
    let lease = store.claim(&r, &worker("a"), long()).await.unwrap();
    assert_eq!(lease.fence().get(), 1);
    assert_eq!(lease.owner(), &worker("a"));
    assert_eq!(lease.run(), &r);
    let after = store.inspect(&r).await.unwrap();
    assert_eq!(after.fence.get(), 1);
    assert_eq!(after.owner, Some(worker("a")));
    assert_eq!(after.expires_at, Some(lease.expires_at()));
    let remaining = after.remaining().unwrap();
    assert!(
        remaining > Duration::from_secs(50) && remaining <= Duration::from_secs(60),
        "expiry is claim time + TTL on the store clock, {remaining:?} left"
    );
}

/// A claim of a held run is refused with the holder and its time left, and changes nothing.
pub async fn a_held_run_is_refused_with_its_holder(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let r = created(&*store, "held").await;
    store.claim(&r, &worker("a"), long()).await.unwrap();
    match store.claim(&r, &worker("b"), long()).await {
        Err(Error::Held {
            owner, remaining, ..
        }) => {
            assert_eq!(owner, worker("a"));
            assert!(remaining > Duration::from_secs(50), "{remaining:?}");
        }
        other => panic!("expected Held by a, got {other:?}"),
    }
    // The holder itself is refused too: a claim is not a renewal.
    assert!(matches!(
        store.claim(&r, &worker("a"), long()).await,
        Err(Error::Held { .. })
    ));
    let record = store.inspect(&r).await.unwrap();
    assert_eq!((record.fence.get(), record.owner), (1, Some(worker("a"))));
}

/// A lease that expired by the store clock is reclaimable, and the new fence is the old + 1.
pub async fn an_expired_lease_is_reclaimable_with_the_next_fence(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let t = crate::timing(&*store);
    let r = created(&*store, "expiring").await;
    let a = store.claim(&r, &worker("a"), t.short_ttl()).await.unwrap();
    crate::until_expired(&*store, &r, t).await;
    let record = store.inspect(&r).await.unwrap();
    assert!(record.is_expired(), "{record:?}");
    let b = store.claim(&r, &worker("b"), long()).await.unwrap();
    assert_eq!(b.fence().get(), a.fence().get() + 1);
    assert_eq!(store.inspect(&r).await.unwrap().owner, Some(worker("b")));
}

/// A write under a fence lower than the current one is rejected with both fences, and not applied.
pub async fn a_write_under_a_lower_fence_is_rejected_with_both_fences(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let t = crate::timing(&*store);
    let r = created(&*store, "stale").await;
    let a = store.claim(&r, &worker("a"), t.short_ttl()).await.unwrap();
    crate::until_expired(&*store, &r, t).await;
    let b = store.claim(&r, &worker("b"), long()).await.unwrap();
    assert_eq!((a.fence().get(), b.fence().get()), (1, 2));
    assert_stale(store.append(&a, b"from a").await, 1, 2);
    assert_stale(store.complete(&a).await, 1, 2);
    assert_stale(store.suspend(&a).await, 1, 2);
    assert_stale(store.release(&a).await, 1, 2);
    assert!(store.journal(&r).await.unwrap().is_empty());
    let record = store.inspect(&r).await.unwrap();
    assert_eq!(
        (record.state, record.owner, record.fence.get()),
        (RunState::Runnable, Some(worker("b")), 2)
    );
    // The current holder is unaffected.
    store.append(&b, b"from b").await.unwrap();
}

/// A write under the current fence after the lease expired, before anyone reclaimed, is accepted:
/// no rejection is ever "your lease expired".
pub async fn a_write_under_the_current_fence_after_expiry_is_accepted(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let t = crate::timing(&*store);
    let r = created(&*store, "late").await;
    let a = store.claim(&r, &worker("a"), t.short_ttl()).await.unwrap();
    crate::until_expired(&*store, &r, t).await;
    assert!(store.inspect(&r).await.unwrap().is_expired());
    let entry = store.append(&a, b"late but safe").await.unwrap();
    assert_eq!(entry.fence.get(), 1);
    let renewed = store.renew(&a).await.unwrap();
    assert!(renewed.expires_at() > a.expires_at());
    assert!(!store.inspect(&r).await.unwrap().is_expired());
}

/// A write under a fence the store never issued (forged, or lost by the store) is rejected as ahead.
pub async fn a_fence_the_store_never_issued_is_rejected_as_ahead(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let r = created(&*store, "forged").await;
    let real = store.claim(&r, &worker("a"), long()).await.unwrap();
    let forged = Lease::new(
        r.clone(),
        worker("a"),
        Fence::new(7).unwrap(),
        real.ttl(),
        real.expires_at(),
    )
    .unwrap();
    match store.append(&forged, b"x").await {
        Err(Error::FenceAhead {
            presented: 7,
            current: 1,
            ..
        }) => {}
        other => panic!("expected FenceAhead {{ 7, 1 }}, got {other:?}"),
    }
    assert!(matches!(
        store.renew(&forged).await,
        Err(Error::FenceAhead { .. })
    ));
    assert!(store.journal(&r).await.unwrap().is_empty());
}

/// Renew moves the expiry forward on the store clock and increments `heartbeats`.
pub async fn renew_extends_expiry_and_counts_heartbeats(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let t = crate::timing(&*store);
    let r = created(&*store, "renewed").await;
    let lease = store
        .claim(&r, &worker("a"), t.at_least(2_000))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let renewed = store.renew(&lease).await.unwrap();
    assert!(renewed.expires_at() > lease.expires_at());
    assert_eq!(renewed.fence(), lease.fence());
    let twice = store.renew(&renewed).await.unwrap();
    assert!(twice.expires_at() >= renewed.expires_at());
    let record = store.inspect(&r).await.unwrap();
    assert_eq!(record.heartbeats, 2);
    assert_eq!(record.expires_at, Some(twice.expires_at()));
    // Renewing past the original TTL keeps the lease: claims are refused.
    let lease = store.claim(&r, &worker("a"), t.short_ttl()).await;
    assert!(matches!(lease, Err(Error::Held { .. })), "{lease:?}");
}

/// Renew under a stale fence is rejected with both fences and bumps nothing.
pub async fn renew_under_a_stale_fence_is_rejected(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let t = crate::timing(&*store);
    let r = created(&*store, "stale-renew").await;
    let a = store.claim(&r, &worker("a"), t.short_ttl()).await.unwrap();
    crate::until_expired(&*store, &r, t).await;
    let b = store.claim(&r, &worker("b"), long()).await.unwrap();
    assert_stale(store.renew(&a).await, 1, 2);
    let record = store.inspect(&r).await.unwrap();
    assert_eq!(record.heartbeats, 0);
    assert_eq!(record.expires_at, Some(b.expires_at()));
}

/// Release makes the run claimable at once, under a higher fence, and the old fence can no longer write.
pub async fn release_makes_the_run_claimable_and_fences_out_the_old_lease(
    factory: &dyn StoreFactory,
) {
    let store = factory.fresh().await;
    let r = created(&*store, "released").await;
    let a = store.claim(&r, &worker("a"), long()).await.unwrap();
    store.release(&a).await.unwrap();
    let record = store.inspect(&r).await.unwrap();
    assert_eq!(
        (record.state, record.owner, record.expires_at),
        (RunState::Runnable, None, None)
    );
    assert_ended(store.append(&a, b"after release").await, 1, Ended::Released);
    assert_ended(store.renew(&a).await, 1, Ended::Released);
    let b = store.claim(&r, &worker("b"), long()).await.unwrap();
    assert_eq!(b.fence().get(), 2);
    assert_stale(store.append(&a, b"after reclaim").await, 1, 2);
}

/// Suspend clears the owner, refuses claims and fenced writes, and `heartbeats` stays still.
pub async fn suspend_clears_the_owner_blocks_claims_and_stops_heartbeats(
    factory: &dyn StoreFactory,
) {
    let store = factory.fresh().await;
    let r = created(&*store, "suspended").await;
    let a = store.claim(&r, &worker("a"), long()).await.unwrap();
    store.renew(&a).await.unwrap();
    store.suspend(&a).await.unwrap();
    let record = store.inspect(&r).await.unwrap();
    assert_eq!(
        (
            record.state,
            record.owner.clone(),
            record.expires_at,
            record.heartbeats
        ),
        (RunState::Suspended, None, None, 1)
    );
    assert!(matches!(
        store.claim(&r, &worker("b"), long()).await,
        Err(Error::Suspended { .. })
    ));
    assert!(store
        .claim_next(&worker("b"), long(), 10)
        .await
        .unwrap()
        .is_empty());
    assert_ended(store.renew(&a).await, 1, Ended::Suspended);
    assert_ended(store.append(&a, b"x").await, 1, Ended::Suspended);
    assert_eq!(store.inspect(&r).await.unwrap().heartbeats, 1);
}

/// Resuming a suspended run makes it claimable, and the next claim takes a higher fence.
pub async fn resume_then_claim_takes_a_higher_fence(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let r = created(&*store, "resumed").await;
    let a = store.claim(&r, &worker("a"), long()).await.unwrap();
    store.suspend(&a).await.unwrap();
    let record = store.resume(&r).await.unwrap();
    assert_eq!((record.state, record.owner), (RunState::Runnable, None));
    match store.resume(&r).await {
        Err(Error::NotSuspended {
            state: RunState::Runnable,
            ..
        }) => {}
        other => panic!("expected NotSuspended, got {other:?}"),
    }
    let b = store.claim(&r, &worker("b"), long()).await.unwrap();
    assert_eq!(b.fence().get(), 2);
    assert_stale(store.append(&a, b"x").await, 1, 2);
}

/// Over 100 claim/expire cycles with two workers alternating, fences strictly increase and never repeat.
///
/// A store whose leases last whole seconds (etcd) spends a second or more on each cycle: there
/// the hundred cycles are shared by four runs side by side, 25 each (fences still cross 9 → 10
/// and 19 → 20, where an encoding that orders digits as text would go wrong), so the scenario
/// waits out 25 expiries instead of 100.
pub async fn fences_strictly_increase_over_a_hundred_claim_expire_cycles(
    factory: &dyn StoreFactory,
) {
    let store = factory.fresh().await;
    let t = crate::timing(&*store);
    let lanes: usize = if t.is_stretched() { 4 } else { 1 };
    let cycles = 100 / lanes;
    let tasks: Vec<_> = (0..lanes)
        .map(|lane| {
            let store = store.clone();
            tokio::spawn(async move {
                let r = created(&*store, &format!("cycles-{lane}")).await;
                let workers = [worker("a"), worker("b")];
                let mut fences = Vec::new();
                for cycle in 0..cycles {
                    let lease = loop {
                        match store.claim(&r, &workers[cycle % 2], t.at_least(10)).await {
                            Ok(lease) => break lease,
                            // The previous lease has not expired on the store clock yet. A store
                            // that finds expiry by a sweep may still say held with nothing left:
                            // wait a little then.
                            Err(Error::Held { remaining, .. }) => {
                                tokio::time::sleep(remaining.max(Duration::from_millis(1))).await
                            }
                            Err(e) => panic!("{r}, cycle {cycle}: {e}"),
                        }
                    };
                    assert_eq!(lease.owner(), &workers[cycle % 2]);
                    fences.push(lease.fence().get());
                }
                assert_eq!(fences, (1..=cycles as u64).collect::<Vec<_>>(), "{r}");
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a lane of claim/expire cycles");
    }
}

/// Of N concurrent claims of one run, exactly one wins; the others are told who holds it.
pub async fn concurrent_claims_of_one_run_have_exactly_one_winner(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let r = created(&*store, "contended").await;
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let store = store.clone();
            let r = r.clone();
            tokio::spawn(async move { store.claim(&r, &worker(&format!("w{i}")), long()).await })
        })
        .collect();
    let mut winners = Vec::new();
    let mut holders = HashSet::new();
    for task in tasks {
        match task.await.unwrap() {
            Ok(lease) => winners.push(lease),
            Err(Error::Held { owner, .. }) => {
                holders.insert(owner);
            }
            Err(e) => panic!("unexpected refusal: {e}"),
        }
    }
    assert_eq!(winners.len(), 1, "{winners:?}");
    assert_eq!(winners[0].fence().get(), 1);
    assert!(
        holders.iter().all(|h| h == winners[0].owner()),
        "{holders:?}"
    );
}

/// Concurrent `claim_next` callers never receive the same run, and together they drain every run.
pub async fn claim_next_never_hands_out_a_run_twice(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    const RUNS: usize = 120;
    for i in 0..RUNS {
        created(&*store, &format!("queued-{i:03}")).await;
    }
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut mine = Vec::new();
                loop {
                    let got = store
                        .claim_next(&worker(&format!("w{i}")), long(), 7)
                        .await
                        .unwrap();
                    if got.is_empty() {
                        return mine;
                    }
                    mine.extend(got);
                }
            })
        })
        .collect();
    let mut seen = HashSet::new();
    for task in tasks {
        for lease in task.await.unwrap() {
            assert_eq!(lease.fence().get(), 1, "{lease:?}");
            assert!(
                seen.insert(lease.run().clone()),
                "{} handed out twice",
                lease.run()
            );
        }
    }
    assert_eq!(seen.len(), RUNS);
}

/// `claim_next` takes unowned and expired runnable runs, longest claimable first, never held,
/// suspended or completed ones, and returns nothing when none is claimable.
pub async fn claim_next_takes_claimable_runs_longest_waiting_first(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let t = crate::timing(&*store);
    let old = created(&*store, "z-oldest").await;
    let expiring = created(&*store, "y-expiring").await;
    let held = created(&*store, "x-held").await;
    let suspended = created(&*store, "w-suspended").await;
    let done = created(&*store, "v-done").await;
    let e = store
        .claim(&expiring, &worker("a"), t.short_ttl())
        .await
        .unwrap();
    store.claim(&held, &worker("a"), long()).await.unwrap();
    let s = store.claim(&suspended, &worker("a"), long()).await.unwrap();
    store.suspend(&s).await.unwrap();
    let d = store.claim(&done, &worker("a"), long()).await.unwrap();
    store.complete(&d).await.unwrap();
    crate::until_expired(&*store, &expiring, t).await;
    let newest = created(&*store, "a-newest").await;

    let got = store.claim_next(&worker("b"), long(), 2).await.unwrap();
    let runs: Vec<_> = got.iter().map(|l| l.run().clone()).collect();
    assert_eq!(
        runs,
        vec![old.clone(), expiring.clone()],
        "longest claimable first"
    );
    assert_eq!(
        (got[0].fence().get(), got[1].fence().get()),
        (1, e.fence().get() + 1)
    );
    let rest = store.claim_next(&worker("b"), long(), 10).await.unwrap();
    assert_eq!(
        rest.iter().map(|l| l.run().clone()).collect::<Vec<_>>(),
        vec![newest]
    );
    assert!(store
        .claim_next(&worker("b"), long(), 10)
        .await
        .unwrap()
        .is_empty());
}

/// Complete is fenced and terminal: the run can never be claimed or written again.
pub async fn complete_is_terminal_and_fenced(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let t = crate::timing(&*store);
    let r = created(&*store, "completed").await;
    let a = store.claim(&r, &worker("a"), t.short_ttl()).await.unwrap();
    crate::until_expired(&*store, &r, t).await;
    let b = store.claim(&r, &worker("b"), long()).await.unwrap();
    assert_stale(store.complete(&a).await, 1, 2);
    store.complete(&b).await.unwrap();
    let record = store.inspect(&r).await.unwrap();
    assert_eq!(
        (
            record.state,
            record.owner,
            record.expires_at,
            record.fence.get()
        ),
        (RunState::Completed, None, None, 2)
    );
    assert!(matches!(
        store.claim(&r, &worker("c"), long()).await,
        Err(Error::Completed { .. })
    ));
    assert_ended(store.complete(&b).await, 2, Ended::Completed);
    assert_ended(store.append(&b, b"x").await, 2, Ended::Completed);
    assert!(matches!(
        store.resume(&r).await,
        Err(Error::NotSuspended {
            state: RunState::Completed,
            ..
        })
    ));
    assert!(matches!(
        store.force_release(&r).await,
        Err(Error::Completed { .. })
    ));
}

/// Journal entries come back in write order, numbered from 1, each with the fence it was written under.
pub async fn journal_entries_keep_order_and_record_their_fence(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let r = created(&*store, "journaled").await;
    let a = store.claim(&r, &worker("a"), long()).await.unwrap();
    for i in 0..3 {
        store.append(&a, format!("a{i}").as_bytes()).await.unwrap();
    }
    store.release(&a).await.unwrap();
    let b = store.claim(&r, &worker("b"), long()).await.unwrap();
    store.append(&b, b"b0").await.unwrap();
    let binary: Vec<u8> = (0..=255).collect();
    let last = store.append(&b, &binary).await.unwrap();
    assert_eq!((last.seq, last.fence.get()), (5, 2));
    let journal = store.journal(&r).await.unwrap();
    let got: Vec<_> = journal
        .iter()
        .map(|e| (e.seq, e.fence.get(), e.payload.clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, 1, b"a0".to_vec()),
            (2, 1, b"a1".to_vec()),
            (3, 1, b"a2".to_vec()),
            (4, 2, b"b0".to_vec()),
            (5, 2, binary),
        ]
    );
    assert!(journal
        .windows(2)
        .all(|w| w[0].written_at <= w[1].written_at));
}

/// `renew_many` answers each lease on its own: fine ones renew, stale and ended ones are rejected.
pub async fn renew_many_reports_a_result_per_lease(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let t = crate::timing(&*store);
    let fine = created(&*store, "fine").await;
    let stale = created(&*store, "stale").await;
    let released = created(&*store, "released").await;
    let fine_lease = store.claim(&fine, &worker("a"), long()).await.unwrap();
    let stale_lease = store
        .claim(&stale, &worker("a"), t.short_ttl())
        .await
        .unwrap();
    let released_lease = store.claim(&released, &worker("a"), long()).await.unwrap();
    store.release(&released_lease).await.unwrap();
    crate::until_expired(&*store, &stale, t).await;
    store.claim(&stale, &worker("b"), long()).await.unwrap();

    let batch = [
        fine_lease.clone(),
        stale_lease,
        released_lease,
        fine_lease.clone(),
    ];
    let results = store.renew_many(&batch).await.unwrap();
    assert_eq!(results.len(), 4);
    let renewed = results[0].as_ref().expect("fine lease renews");
    assert_eq!(renewed.run(), &fine);
    assert!(renewed.expires_at() > fine_lease.expires_at());
    assert!(matches!(
        results[1],
        Err(Error::StaleFence {
            presented: 1,
            current: 2,
            ..
        })
    ));
    assert!(matches!(
        results[2],
        Err(Error::LeaseEnded {
            ended: Ended::Released,
            ..
        })
    ));
    assert!(results[3].is_ok());
    assert_eq!(store.inspect(&fine).await.unwrap().heartbeats, 2);
    assert_eq!(store.inspect(&stale).await.unwrap().heartbeats, 0);
    assert!(store.renew_many(&[]).await.unwrap().is_empty());
    let too_many = vec![fine_lease; MAX_BATCH + 1];
    assert!(matches!(
        store.renew_many(&too_many).await,
        Err(Error::InvalidInput(InvalidInput::BatchTooLarge { .. }))
    ));
    assert_eq!(store.inspect(&fine).await.unwrap().heartbeats, 2);
}
