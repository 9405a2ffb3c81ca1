//! The job layer's scenarios: cancel (a run ended for good by someone other than its holder,
//! in any state but completed, with the holder fenced out by the store and told why), and runs
//! created with a start delay.

use std::sync::Arc;
use std::time::Duration;

use lease_core::{
    End, Ended, Ending, Error, InvalidInput, LeaseStoreExt, ListFilter, NewRun, RunState,
    MAX_REASON_BYTES,
};
use lease_runtime::{CancelReason, RunScope, ScopeConfig};
use tokio::time::Instant;

use crate::scenarios::{created, long, worker};
use crate::scope_scenarios::cancelled_within;
use crate::StoreFactory;

/// Asserts `answer` is the store's verdict that the lease at `fence` ended by a cancel.
#[track_caller]
fn assert_cancelled_verdict<T: std::fmt::Debug>(answer: &lease_core::Result<T>, fence: u64) {
    assert!(
        matches!(
            answer,
            Err(Error::LeaseEnded { ended: Ended::Cancelled, fence: f, .. }) if *f == fence
        ),
        "expected LeaseEnded {{ cancelled, fence {fence} }}, got {answer:?}"
    );
}

/// Cancel ends a waiting, a delayed, a suspended, a failed and a held run alike: each is
/// `cancelled` with the reason, unowned, and never handed out again (`claim` refused as
/// cancelled, `claim_next` passing it by); `resume` and `force_release` refuse it. Cancelling
/// again returns the record unchanged (the first reason stays). A completed run cannot be
/// cancelled, an unknown one is not found, and a bad reason is refused before any I/O with
/// the run untouched. `list` and `count` show cancelled runs.
pub async fn cancel_ends_a_run_in_every_state_but_completed(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let waiting = created(&*store, "waiting").await;
    let delayed = created(&*store, "delayed").await;
    let l = store.claim(&delayed, &worker("a"), long()).await.unwrap();
    store
        .retry_after(&l, Duration::from_secs(3600))
        .await
        .unwrap();
    let parked = created(&*store, "parked").await;
    let l = store.claim(&parked, &worker("a"), long()).await.unwrap();
    store.suspend(&l).await.unwrap();
    let failed = created(&*store, "failed").await;
    let l = store.claim(&failed, &worker("a"), long()).await.unwrap();
    store.fail(&l, "card declined").await.unwrap();
    let held = created(&*store, "held").await;
    let holding = store.claim(&held, &worker("h"), long()).await.unwrap();
    let done = created(&*store, "done").await;
    let l = store.claim(&done, &worker("a"), long()).await.unwrap();
    store.complete(&l).await.unwrap();

    // Bad input first: refused before the store, the holder untouched.
    for bad in ["x".repeat(MAX_REASON_BYTES + 1), "bell\u{7}".to_owned()] {
        let answer = store.cancel(&held, &bad).await;
        assert!(
            matches!(
                answer,
                Err(Error::InvalidInput(
                    InvalidInput::ReasonTooLong { .. }
                        | InvalidInput::ReasonControlCharacter { .. }
                ))
            ),
            "a bad reason answered {answer:?}"
        );
    }
    store
        .renew(&holding)
        .await
        .expect("a refused cancel changes nothing");

    let reason = "customer asked: {ä} \n refund issued";
    for run in [&waiting, &delayed, &parked, &failed, &held] {
        let record = store.cancel(run, reason).await.unwrap();
        assert_eq!(
            (
                record.state,
                record.owner.as_ref(),
                record.expires_at,
                record.not_before,
                record.failure.as_deref()
            ),
            (RunState::Cancelled, None, None, None, Some(reason)),
            "{run}"
        );
        let read = store.inspect(run).await.unwrap();
        assert_eq!(
            (read.state, read.failure.as_deref(), read.fence),
            (RunState::Cancelled, Some(reason), record.fence)
        );
        let again = store.cancel(run, "a second reason").await.unwrap();
        assert_eq!(
            (again.state, again.failure.as_deref(), again.fence),
            (RunState::Cancelled, Some(reason), record.fence),
            "a second cancel changes nothing"
        );
        assert!(
            matches!(store.claim(run, &worker("b"), long()).await, Err(Error::Cancelled { run: r }) if &r == run),
            "{run} claimed after its cancel"
        );
        assert!(matches!(
            store.resume(run).await,
            Err(Error::NotSuspended {
                state: RunState::Cancelled,
                ..
            })
        ));
        assert!(matches!(
            store.force_release(run).await,
            Err(Error::Cancelled { .. })
        ));
    }
    assert!(store
        .claim_next(&worker("b"), long(), 10)
        .await
        .unwrap()
        .is_empty());
    assert!(matches!(
        store.cancel(&done, reason).await,
        Err(Error::Completed { run }) if run == done
    ));
    assert_eq!(
        store.inspect(&done).await.unwrap().state,
        RunState::Completed
    );
    let unknown = crate::scenarios::run("never-created");
    assert!(matches!(
        store.cancel(&unknown, reason).await,
        Err(Error::NotFound { run }) if run == unknown
    ));

    let listed = store
        .list(&ListFilter::new().with_state(Some(RunState::Cancelled)))
        .await
        .unwrap();
    let mut expected = vec![&delayed, &failed, &held, &parked, &waiting];
    expected.sort();
    assert_eq!(listed.iter().map(|r| &r.run).collect::<Vec<_>>(), expected);
    match store.count().await {
        Err(Error::InvalidInput(InvalidInput::Unsupported { .. })) => {}
        Err(e) => panic!("count: {e}"),
        Ok(counts) => assert_eq!(
            (
                counts.cancelled,
                counts.completed,
                counts.failed,
                counts.suspended,
                counts.delayed,
                counts.held,
                counts.claimable
            ),
            (5, 1, 0, 0, 0, 0, 0),
            "{counts:?}"
        ),
    }
}

/// A held run's holder is fenced out at once, with a verdict that names the cancel: its
/// append, renewal, batch renewal, end and batched end are all refused as
/// `LeaseEnded { cancelled }` under its fence, and nothing it writes after the cancel lands.
/// A scope holding the run is cancelled at its next heartbeat with that verdict.
pub async fn cancel_fences_out_the_holder_with_a_verdict_naming_it(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let t = crate::timing(&*store);
    let r = created(&*store, "charge").await;
    let lease = store.claim(&r, &worker("a"), long()).await.unwrap();
    store.append(&lease, b"started").await.unwrap();
    store.cancel(&r, "fraud suspected").await.unwrap();

    assert_cancelled_verdict(&store.append(&lease, b"charged").await, 1);
    assert_cancelled_verdict(&store.renew(&lease).await, 1);
    let many = store
        .renew_many(std::slice::from_ref(&lease))
        .await
        .unwrap();
    assert_cancelled_verdict(&many[0], 1);
    assert_cancelled_verdict(&store.complete_with(&lease, b"charged").await, 1);
    assert_cancelled_verdict(&store.release(&lease).await, 1);
    let ends = store
        .end_many(&[Ending::new(lease.clone(), End::Complete)])
        .await
        .unwrap();
    assert_cancelled_verdict(&ends[0], 1);
    let journal = store.journal(&r).await.unwrap();
    assert_eq!(
        journal
            .iter()
            .map(|e| e.payload.as_slice())
            .collect::<Vec<_>>(),
        [&b"started"[..]],
        "nothing written after the cancel"
    );
    assert_eq!(store.inspect(&r).await.unwrap().state, RunState::Cancelled);

    // A scope: cancelled at its next heartbeat, with the store's verdict.
    let scoped = created(&*store, "scoped").await;
    let heartbeat = Duration::from_millis(100);
    let config = ScopeConfig::default().with_heartbeat(heartbeat);
    let scope = RunScope::claim(
        store.clone(),
        &scoped,
        &worker("a"),
        t.at_least(5_000),
        config,
    )
    .await
    .unwrap();
    let cancelled_at = Instant::now();
    store.cancel(&scoped, "operator").await.unwrap();
    let (at, reason) = cancelled_within(&scope, Duration::from_secs(3)).await;
    match &reason {
        CancelReason::Rejected(e) => assert!(
            matches!(
                **e,
                Error::LeaseEnded {
                    ended: Ended::Cancelled,
                    fence: 1,
                    ..
                }
            ),
            "{e}"
        ),
        other => panic!("expected the cancel as the reason, got {other}"),
    }
    assert!(
        at.duration_since(cancelled_at) < Duration::from_secs(2),
        "cancelled {:?} after the cancel, with a heartbeat every {heartbeat:?}",
        at.duration_since(cancelled_at)
    );
    assert_cancelled_verdict(&scope.append(b"after the cancel").await, 1);
}

/// `call` again while it answers a retryable error (a row another write holds, a lost
/// answer), for up to 10 s, as a worker would: the answer that counts is a verdict.
async fn retried<T, F, Fut>(call: F) -> lease_core::Result<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = lease_core::Result<T>>,
{
    let started = Instant::now();
    loop {
        match call().await {
            Err(e) if e.is_retryable() && started.elapsed() < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            answer => return answer,
        }
    }
}

/// A cancel racing the holder's completion (with its effect in the journal): exactly one
/// wins. Either the completion commits, the effect is in the journal and the cancel is
/// refused as completed; or the cancel commits, the completion is refused as cancelled and the
/// journal holds no effect. A retryable answer is retried, as a worker would (a retried
/// completion that had been applied is refused as completed under its own fence, which
/// counts as its win). 200 races, 20 at a time.
pub async fn a_cancel_racing_the_holders_end_has_exactly_one_winner(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let (mut completed, mut cancelled) = (0, 0);
    for round in 0..10 {
        let mut races = Vec::new();
        for i in 0..20 {
            let r = created(&*store, &format!("race-{round}-{i}")).await;
            let lease = store.claim(&r, &worker("a"), long()).await.unwrap();
            let (s1, s2) = (Arc::clone(&store), Arc::clone(&store));
            let (r1, l1) = (r.clone(), lease.clone());
            races.push(tokio::spawn(async move {
                let end = tokio::spawn(async move {
                    retried(|| async { s1.complete_with(&l1, b"effect").await }).await
                });
                let cancel = tokio::spawn(async move {
                    retried(|| async { s2.cancel(&r1, "race").await }).await
                });
                (r, end.await.unwrap(), cancel.await.unwrap())
            }));
        }
        for race in races {
            let (r, end, cancel) = race.await.unwrap();
            let record = store.inspect(&r).await.unwrap();
            let effects = store.journal(&r).await.unwrap().len();
            match (&end, &cancel) {
                (
                    Ok(())
                    | Err(Error::LeaseEnded {
                        ended: Ended::Completed,
                        fence: 1,
                        ..
                    }),
                    Err(Error::Completed { .. }),
                ) => {
                    assert_eq!((record.state, effects), (RunState::Completed, 1), "{r}");
                    completed += 1;
                }
                (
                    Err(Error::LeaseEnded {
                        ended: Ended::Cancelled,
                        ..
                    }),
                    Ok(rec),
                ) => {
                    assert_eq!(rec.state, RunState::Cancelled);
                    assert_eq!((record.state, effects), (RunState::Cancelled, 0), "{r}");
                    cancelled += 1;
                }
                other => panic!("{r}: not exactly one winner: {other:?}"),
            }
        }
    }
    eprintln!("cancel races: {completed} completed first, {cancelled} cancelled first");
    assert_eq!(completed + cancelled, 200);
}

/// Retention takes cancelled runs as it takes completed and failed ones, raising the fence
/// floor: the id created again starts past the cancelled run's fence, and the cancelled
/// holder's lease stays refused.
pub async fn purge_removes_cancelled_runs_and_never_reuses_their_fence(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let r = created(&*store, "cancelled").await;
    let lease = store.claim(&r, &worker("a"), long()).await.unwrap();
    store.cancel(&r, "not needed").await.unwrap();
    let live = created(&*store, "live").await;
    match store.count_purgeable(Duration::ZERO).await {
        Err(Error::InvalidInput(InvalidInput::Unsupported { .. })) => {}
        other => assert_eq!(other.ok(), Some(1), "count_purgeable"),
    }
    let purged = store.purge(Duration::ZERO, 10).await.unwrap();
    assert_eq!(purged, vec![r.clone()]);
    assert!(matches!(
        store.inspect(&r).await,
        Err(Error::NotFound { .. })
    ));
    assert_eq!(
        store.inspect(&live).await.unwrap().state,
        RunState::Runnable
    );
    store.create(&r).await.unwrap();
    let again = store.claim(&r, &worker("b"), long()).await.unwrap();
    assert_eq!(again.fence().get(), 2, "the new life starts past fence 1");
    assert!(matches!(
        store.append(&lease, b"late").await,
        Err(Error::StaleFence {
            presented: 1,
            current: 2,
            ..
        })
    ));
}

/// A run created with a start delay (`create_with`, `create_many_with`) waits for it on the
/// store's clock, as a retry delay does: `claim` is refused as `Delayed` with the time left,
/// `claim_next` passes it by and hands out the batch's undelayed runs in input order, the
/// record says when it becomes claimable, and `count` counts it as delayed. Once the delay is
/// over it is claimed at fence 1, its first attempt (waiting used none). A delay over the
/// maximum is refused before any I/O, alone or as one item of a batch, and nothing is created.
pub async fn a_run_created_with_a_delay_waits_for_it_on_the_store_clock(
    factory: &dyn StoreFactory,
) {
    let store = factory.fresh().await;
    let t = crate::timing(&*store);
    let delay = t.ttl(400).as_duration();
    let too_long = lease_core::MAX_START_DELAY + Duration::from_millis(1);
    let bad = NewRun::new(crate::scenarios::run("bad")).with_delay(too_long);
    assert!(matches!(
        store.create_with(&bad).await,
        Err(Error::InvalidInput(InvalidInput::StartDelayTooLong { .. }))
    ));
    let batch_bad = [NewRun::new(crate::scenarios::run("fine")), bad.clone()];
    assert!(matches!(
        store.create_many_with(&batch_bad).await,
        Err(Error::InvalidInput(InvalidInput::StartDelayTooLong { .. }))
    ));
    for id in ["bad", "fine"] {
        assert!(
            matches!(
                store.inspect(&crate::scenarios::run(id)).await,
                Err(Error::NotFound { .. })
            ),
            "{id} was created by a refused call"
        );
    }

    let sent = Instant::now();
    let later = crate::scenarios::run("later");
    let record = store
        .create_with(&NewRun::new(later.clone()).with_delay(delay))
        .await
        .unwrap();
    assert_eq!(
        (record.state, record.owner.as_ref(), record.attempts),
        (RunState::Runnable, None, 0)
    );
    let read = store.inspect(&later).await.unwrap();
    let left = read
        .not_before
        .expect("a delayed run says when it is claimable")
        .saturating_since(read.observed_at);
    assert!(
        !left.is_zero() && left <= delay,
        "claimable in {left:?} after a delay of {delay:?}"
    );
    let batch = [
        NewRun::new(crate::scenarios::run("first")),
        NewRun::new(crate::scenarios::run("held-back")).with_delay(delay),
        NewRun::new(crate::scenarios::run("second")),
        NewRun::new(later.clone()),
    ];
    let created = store.create_many_with(&batch).await.unwrap();
    assert!(created[..3].iter().all(Result::is_ok), "{created:?}");
    assert!(matches!(&created[3], Err(Error::AlreadyExists { run }) if *run == later));
    assert!(matches!(
        store
            .create_with(&NewRun::new(later.clone()).with_delay(delay))
            .await,
        Err(Error::AlreadyExists { .. })
    ));

    match store.claim(&later, &worker("a"), long()).await {
        Err(Error::Delayed { run, remaining }) => {
            assert_eq!(run, later);
            assert!(!remaining.is_zero() && remaining <= delay, "{remaining:?}");
        }
        other => panic!("a claim inside the start delay answered {other:?}"),
    }
    let handed: Vec<String> = store
        .claim_next(&worker("a"), long(), 10)
        .await
        .unwrap()
        .iter()
        .map(|l| l.run().to_string())
        .collect();
    assert_eq!(
        handed,
        ["first", "second"],
        "only the undelayed runs, in input order"
    );
    match store.count().await {
        Err(Error::InvalidInput(InvalidInput::Unsupported { .. })) => {}
        Err(e) => panic!("count: {e}"),
        Ok(counts) => assert_eq!(counts.delayed, 2, "{counts:?}"),
    }

    // Claimed once the delay is over, and not before it could have passed.
    let lag = t.capabilities().max_expiry_lag;
    let deadline = sent + delay + lag + Duration::from_secs(5);
    let lease = loop {
        let claimed = store.claim(&later, &worker("b"), long()).await;
        // The latest instant the store can have judged the claim (see
        // a_retry_delay_holds_the_run_back_on_the_store_clock).
        let returned = Instant::now();
        match claimed {
            Ok(lease) => {
                assert!(
                    returned + Duration::from_millis(5) >= sent + delay,
                    "claimed and answered {:?} after the create, inside a delay of {delay:?}",
                    returned - sent
                );
                break lease;
            }
            Err(Error::Delayed { .. }) => {}
            Err(e) => panic!("claim after the delay: {e}"),
        }
        assert!(
            Instant::now() < deadline,
            "the delayed run never became claimable"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!((lease.fence().get(), lease.attempt()), (1, 1));
}
