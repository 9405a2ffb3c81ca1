//! Store-level scenarios: the rules of the `LeaseStore` contract, one function each (where each
//! rule lives: ARCHITECTURE.md).

use std::collections::HashSet;
use std::time::Duration;

use lease_core::{
    Ended, Error, Fence, InvalidInput, Lease, LeaseStore, ListFilter, RunId, RunState, Ttl,
    WorkerId, MAX_BATCH,
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
fn assert_stale<T: std::fmt::Debug>(result: lease_core::Result<T>, presented: u64, current: u64) {
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
fn assert_ended<T: std::fmt::Debug>(result: lease_core::Result<T>, fence: u64, how: Ended) {
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
    let t = crate::timing(factory);
    let store = factory.fresh().await;
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
    let t = crate::timing(factory);
    let store = factory.fresh().await;
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
    let t = crate::timing(factory);
    let store = factory.fresh().await;
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
    let t = crate::timing(factory);
    let store = factory.fresh().await;
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
    let t = crate::timing(factory);
    let store = factory.fresh().await;
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
    let t = crate::timing(factory);
    let store = factory.fresh().await;
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
    let t = crate::timing(factory);
    let store = factory.fresh().await;
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
    let t = crate::timing(factory);
    let store = factory.fresh().await;
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
    let t = crate::timing(factory);
    let store = factory.fresh().await;
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

/// Bad input (empty, oversize, control-character ids, zero TTL, bad batch sizes, huge payloads)
/// is refused with a typed reason and changes nothing.
pub async fn bad_input_is_refused_and_changes_nothing(factory: &dyn StoreFactory) {
    assert!(matches!(RunId::new(""), Err(InvalidInput::EmptyId { .. })));
    assert!(matches!(
        RunId::new("x".repeat(256)),
        Err(InvalidInput::IdTooLong { len: 256, .. })
    ));
    assert!(matches!(
        WorkerId::new("tab\there"),
        Err(InvalidInput::ControlCharacter { at: 3, .. })
    ));
    assert!(matches!(
        Ttl::from_millis(0),
        Err(InvalidInput::TtlTooShort { .. })
    ));
    assert!(matches!(
        Ttl::from_secs(86_401),
        Err(InvalidInput::TtlTooLong { .. })
    ));

    let store = factory.fresh().await;
    let r = created(&*store, "guarded").await;
    for max in [0, MAX_BATCH + 1] {
        assert!(matches!(
            store.claim_next(&worker("a"), long(), max).await,
            Err(Error::InvalidInput(_))
        ));
    }
    let lease = store.claim(&r, &worker("a"), long()).await.unwrap();
    let huge = vec![0u8; lease_core::MAX_PAYLOAD_BYTES + 1];
    assert!(matches!(
        store.append(&lease, &huge).await,
        Err(Error::InvalidInput(InvalidInput::PayloadTooLarge { .. }))
    ));
    let filter = ListFilter::new().with_limit(0);
    assert!(matches!(
        store.list(&filter).await,
        Err(Error::InvalidInput(InvalidInput::ListLimit { .. }))
    ));
    let record = store.inspect(&r).await.unwrap();
    assert_eq!((record.fence.get(), record.heartbeats), (1, 0));
    assert!(store.journal(&r).await.unwrap().is_empty());
}

/// Every operation on a run that does not exist says so.
pub async fn unknown_runs_are_not_found(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let ghost = run("ghost");
    let lease = Lease::new(
        ghost.clone(),
        worker("a"),
        Fence::new(1).unwrap(),
        long(),
        Default::default(),
    )
    .unwrap();
    let not_found = |e: &Error| matches!(e, Error::NotFound { run } if *run == ghost);
    assert!(not_found(
        &store.claim(&ghost, &worker("a"), long()).await.unwrap_err()
    ));
    assert!(not_found(&store.inspect(&ghost).await.unwrap_err()));
    assert!(not_found(&store.journal(&ghost).await.unwrap_err()));
    assert!(not_found(&store.resume(&ghost).await.unwrap_err()));
    assert!(not_found(&store.force_release(&ghost).await.unwrap_err()));
    assert!(not_found(&store.renew(&lease).await.unwrap_err()));
    assert!(not_found(&store.append(&lease, b"x").await.unwrap_err()));
    assert!(not_found(&store.release(&lease).await.unwrap_err()));
    assert!(not_found(&store.suspend(&lease).await.unwrap_err()));
    assert!(not_found(&store.complete(&lease).await.unwrap_err()));
    let batch = store
        .renew_many(std::slice::from_ref(&lease))
        .await
        .unwrap();
    assert!(not_found(batch[0].as_ref().unwrap_err()));
    assert!(store
        .claim_next(&worker("a"), long(), 5)
        .await
        .unwrap()
        .is_empty());
}

/// Creating a run twice is refused and leaves the first record as it was.
pub async fn create_twice_is_refused(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let r = created(&*store, "twice").await;
    store.claim(&r, &worker("a"), long()).await.unwrap();
    assert!(matches!(
        store.create(&r).await,
        Err(Error::AlreadyExists { run }) if run == r
    ));
    let record = store.inspect(&r).await.unwrap();
    assert_eq!((record.fence.get(), record.owner), (1, Some(worker("a"))));
}

/// Run ids made of quotes, braces, colons, spaces, SQL, Lua and multi-byte text are stored and
/// returned verbatim, and distinct ids never collide.
pub async fn hostile_run_ids_are_stored_verbatim(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let ids = [
        "a'b\"c; DROP TABLE runs; --".to_string(),
        "{slot}:run:1".to_string(),
        "{slot}".to_string(),
        "run:1".to_string(),
        "run".to_string(),
        "with space".to_string(),
        "%s %d \\ $1 ]] --[[ ".to_string(),
        "é".repeat(127) + "x",
        "日本語のラン".to_string(),
    ];
    for id in &ids {
        let r = created(&*store, id).await;
        let lease = store.claim(&r, &worker("w:{x}"), long()).await.unwrap();
        store.append(&lease, id.as_bytes()).await.unwrap();
    }
    for id in &ids {
        let r = run(id);
        let record = store.inspect(&r).await.unwrap();
        assert_eq!(record.run.as_str(), id);
        assert_eq!(
            (record.fence.get(), record.owner),
            (1, Some(worker("w:{x}")))
        );
        let journal = store.journal(&r).await.unwrap();
        assert_eq!(journal.len(), 1, "{id}");
        assert_eq!(journal[0].payload, id.as_bytes());
    }
    let listed = store
        .list(&ListFilter::default())
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.run.as_str().to_string())
        .collect::<HashSet<_>>();
    assert_eq!(listed, ids.iter().cloned().collect::<HashSet<_>>());
}

/// `list` filters by state and by expiry, pages by run id, and orders by run id.
pub async fn list_filters_by_state_and_expiry(factory: &dyn StoreFactory) {
    let t = crate::timing(factory);
    let store = factory.fresh().await;
    let a = created(&*store, "a").await;
    let b = created(&*store, "b").await;
    let c = created(&*store, "c").await;
    let d = created(&*store, "d").await;
    store.claim(&a, &worker("w"), long()).await.unwrap();
    store.claim(&b, &worker("w"), t.short_ttl()).await.unwrap();
    let lc = store.claim(&c, &worker("w"), long()).await.unwrap();
    store.suspend(&lc).await.unwrap();
    crate::until_expired(&*store, &b, t).await;

    let ids = |records: Vec<lease_core::RunRecord>| {
        records.into_iter().map(|r| r.run).collect::<Vec<_>>()
    };
    let all = store.list(&ListFilter::default()).await.unwrap();
    assert_eq!(ids(all), vec![a.clone(), b.clone(), c.clone(), d.clone()]);
    let runnable = ListFilter::new().with_state(Some(RunState::Runnable));
    assert_eq!(
        ids(store.list(&runnable).await.unwrap()),
        vec![a.clone(), b.clone(), d.clone()]
    );
    let expired = ListFilter::new().with_expired(true);
    assert_eq!(ids(store.list(&expired).await.unwrap()), vec![b.clone()]);
    let suspended = ListFilter::new().with_state(Some(RunState::Suspended));
    assert_eq!(ids(store.list(&suspended).await.unwrap()), vec![c.clone()]);
    let page = ListFilter::new().with_after(Some(a.clone())).with_limit(2);
    assert_eq!(ids(store.list(&page).await.unwrap()), vec![b, c]);
}

/// `force_release` takes a held run from its holder: the holder's writes are refused, and the
/// next claim gets a higher fence that fences the old holder out for good.
pub async fn force_release_hands_the_run_over_under_a_higher_fence(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let r = created(&*store, "taken-over").await;
    let a = store.claim(&r, &worker("a"), long()).await.unwrap();
    let record = store.force_release(&r).await.unwrap();
    assert_eq!((record.owner, record.fence.get()), (None, 1));
    assert_ended(store.append(&a, b"x").await, 1, Ended::Released);
    let b = store.claim(&r, &worker("b"), long()).await.unwrap();
    assert_eq!(b.fence().get(), 2);
    assert_stale(store.renew(&a).await, 1, 2);
    let s = store
        .claim(&created(&*store, "parked").await, &worker("a"), long())
        .await
        .unwrap();
    store.suspend(&s).await.unwrap();
    assert!(matches!(
        store.force_release(s.run()).await,
        Err(Error::Suspended { .. })
    ));
}

/// A keyed append applies once per key: the same key again answers the first entry (its own
/// payload, seq and fence) and writes nothing; another key appends; a keyed append under a
/// fence that moved on is refused as stale even though its key exists; under the current
/// fence an existing key answers its entry, even after the lease ended; a new key after the
/// end is refused as ended.
pub async fn a_keyed_append_applies_once_per_key(factory: &dyn StoreFactory) {
    use lease_core::IdempotencyKey;
    let key = |k: &str| IdempotencyKey::new(k).expect("valid key");
    let store = factory.fresh().await;
    let r = created(&*store, "keyed").await;
    let a = store.claim(&r, &worker("a"), long()).await.unwrap();
    let first = store
        .append_keyed(&a, &key("charge"), b"charged 10")
        .await
        .unwrap();
    assert_eq!((first.seq, first.fence.get()), (1, 1));
    let again = store
        .append_keyed(&a, &key("charge"), b"a retry's payload")
        .await
        .unwrap();
    assert_eq!(again, first, "the same key answers the first entry");
    let other = store
        .append_keyed(&a, &key("receipt"), b"mailed")
        .await
        .unwrap();
    assert_eq!((other.seq, other.payload.as_slice()), (2, &b"mailed"[..]));
    assert_eq!(store.journal(&r).await.unwrap().len(), 2);

    // Reclaimed: the old lease's keyed retry is stale, key or not.
    store.force_release(&r).await.unwrap();
    let b = store.claim(&r, &worker("b"), long()).await.unwrap();
    assert_stale(store.append_keyed(&a, &key("charge"), b"late").await, 1, 2);
    assert_stale(store.append_keyed(&a, &key("new"), b"late").await, 1, 2);
    // Under the current fence an existing key answers its entry, whoever wrote it.
    let seen = store
        .append_keyed(&b, &key("charge"), b"again")
        .await
        .unwrap();
    assert_eq!(seen, first);
    let third = store.append_keyed(&b, &key("b-step"), b"b").await.unwrap();
    assert_eq!((third.seq, third.fence.get()), (3, 2));
    store.complete(&b).await.unwrap();
    // A retry after the end learns its first result; a new key is refused as ended.
    assert_eq!(
        store.append_keyed(&b, &key("b-step"), b"b").await.unwrap(),
        third
    );
    assert_ended(
        store.append_keyed(&b, &key("after"), b"x").await,
        2,
        Ended::Completed,
    );
    assert_eq!(store.journal(&r).await.unwrap().len(), 3);
    // Bad input is refused before the store.
    assert!(matches!(
        IdempotencyKey::new(""),
        Err(InvalidInput::EmptyId { .. })
    ));
    let big = vec![0u8; lease_core::MAX_PAYLOAD_BYTES + 1];
    assert!(matches!(
        store.append_keyed(&b, &key("big"), &big).await,
        Err(Error::InvalidInput(InvalidInput::PayloadTooLarge { .. }))
    ));
}

/// `inspect_many` reads many records in one call, in input order, with `NotFound` for a run
/// that does not exist (repeats answered each time); each record is what `inspect` says; more
/// than `MAX_BATCH` ids are refused before the store.
pub async fn inspect_many_answers_each_run_in_order(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let a = created(&*store, "a").await;
    let b = created(&*store, "b").await;
    let held = store.claim(&b, &worker("w"), long()).await.unwrap();
    let missing = run("missing");
    let got = store
        .inspect_many(&[b.clone(), missing.clone(), a.clone(), b.clone()])
        .await
        .unwrap();
    assert_eq!(got.len(), 4);
    let one = got[0].as_ref().unwrap();
    assert_eq!(
        (one.run.clone(), one.fence, one.owner.clone(), one.state),
        (
            b.clone(),
            held.fence(),
            Some(worker("w")),
            RunState::Runnable
        )
    );
    assert!(matches!(&got[1], Err(Error::NotFound { run }) if *run == missing));
    assert_eq!(got[2].as_ref().unwrap().fence, Fence::ZERO);
    assert_eq!(got[3].as_ref().unwrap().run, b);
    assert!(store.inspect_many(&[]).await.unwrap().is_empty());
    let too_many: Vec<RunId> = (0..=MAX_BATCH).map(|i| run(&format!("r{i}"))).collect();
    assert!(matches!(
        store.inspect_many(&too_many).await,
        Err(Error::InvalidInput(InvalidInput::BatchTooLarge { .. }))
    ));
}
