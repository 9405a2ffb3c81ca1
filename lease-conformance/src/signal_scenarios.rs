//! Signals ([`End::AwaitSignal`], [`SignalExt::signal`]): a run waits for a named signal, and a
//! signal answers only the wait its token names, once.
//!
//! A backend without signals says so ([`Capabilities::signals`](lease_core::Capabilities)) and
//! refuses a wait and a delivery with [`InvalidInput::Unsupported`], changing nothing: the
//! scenarios check those refusals and stop there.

use std::sync::Arc;
use std::time::Duration;

use lease_core::{
    End, Error, Fence, InvalidInput, Lease, LeaseStore, LeaseStoreExt, ListFilter, RunState,
    SignalExt, SignalName, SignalRefusal, SignalToken, WaitEnd, MAX_SIGNAL_PAYLOAD_BYTES,
};

use crate::scenarios::{created, long, run, worker};
use crate::StoreFactory;

/// The token of the wait `lease` begins by waiting for `name`.
fn token(store: &dyn LeaseStore, lease: &Lease, name: &str) -> SignalToken {
    SignalToken::for_lease(lease, name, store.signal_key()).expect("valid name")
}

/// Ends `lease` waiting for `name` for `timeout`, and returns the wait's token.
async fn wait(store: &dyn LeaseStore, lease: &Lease, name: &str, timeout: Duration) -> SignalToken {
    let token = token(store, lease, name);
    store
        .end_one(lease, End::await_signal(name, timeout).unwrap())
        .await
        .expect("await_signal");
    token
}

#[track_caller]
fn assert_refused<T: std::fmt::Debug>(
    result: lease_core::Result<T>,
    state: RunState,
    reason: SignalRefusal,
) {
    match result {
        Err(Error::StaleSignal {
            state: s,
            reason: r,
            ..
        }) => assert_eq!((s, r), (state, reason), "the refusal's state and reason"),
        other => panic!("expected StaleSignal {{ {state}, {reason:?} }}, got {other:?}"),
    }
}

/// `false` (after checking that the store refuses a wait and a delivery, changing nothing)
/// when the store has no signals.
async fn has_signals(store: &dyn LeaseStore) -> bool {
    if store.capabilities().signals {
        return true;
    }
    let id = created(store, "no-signals").await;
    let lease = store.claim(&id, &worker("w"), long()).await.unwrap();
    let refused = store
        .end_one(
            &lease,
            End::await_signal("approval", Duration::from_secs(60)).unwrap(),
        )
        .await;
    assert!(
        matches!(
            refused,
            Err(Error::InvalidInput(InvalidInput::Unsupported { .. }))
        ),
        "{refused:?}"
    );
    let record = store.inspect(&id).await.unwrap();
    assert_eq!(
        (record.state, record.owner.is_some()),
        (RunState::Runnable, true)
    );
    let t = token(store, &lease, "approval");
    let refused = store.signal(&t, b"yes").await;
    assert!(
        matches!(
            refused,
            Err(Error::InvalidInput(InvalidInput::Unsupported { .. }))
        ),
        "{refused:?}"
    );
    false
}

/// A run waits for a signal: suspended with its wait on the record, released, not claimable.
/// A signal delivers once (the same delivery again answers as a duplicate and changes nothing;
/// another payload is refused), the next claim takes a higher fence and its lease carries the
/// signal. Once the run waits again, the first wait's token is refused; a token of the wait
/// for another name, or of a wait the run never had, is refused too.
pub async fn a_signal_answers_its_wait_once_under_a_higher_fence(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    if !has_signals(&*store).await {
        return;
    }
    let id = created(&*store, "order-1").await;
    let lease = store.claim(&id, &worker("w1"), long()).await.unwrap();
    let first = wait(&*store, &lease, "approval", Duration::from_secs(60)).await;

    let record = store.inspect(&id).await.unwrap();
    assert_eq!(record.state, RunState::Suspended);
    assert_eq!(record.owner, None, "the wait released the lease");
    let w = record.wait.clone().expect("the record shows the wait");
    assert_eq!((w.name.as_str(), w.fence.get()), ("approval", 1));
    let deadline = w.deadline.expect("a deadline");
    let ahead = deadline.saturating_since(record.observed_at);
    assert!(
        ahead > Duration::from_secs(50) && ahead <= Duration::from_secs(60),
        "deadline {ahead:?} ahead"
    );
    let waiting = store
        .list(&ListFilter::new().with_state(RunState::Suspended))
        .await
        .unwrap();
    assert_eq!(waiting.len(), 1);
    assert!(matches!(
        store.claim(&id, &worker("w2"), long()).await,
        Err(Error::Suspended { .. })
    ));
    assert!(store
        .claim_next(&worker("w2"), long(), 10)
        .await
        .unwrap()
        .is_empty());
    // The waiting lease can write no more.
    assert!(store.renew(&lease).await.is_err());

    // Another name under the right wait, and a wait the run never had.
    let other = SignalToken::new(
        id.clone(),
        SignalName::new("payment").unwrap(),
        Fence::new(1).unwrap(),
        store.signal_key(),
    );
    assert_refused(
        store.signal(&other, b"x").await,
        RunState::Suspended,
        SignalRefusal::OtherSignal,
    );
    let ahead = SignalToken::new(
        id.clone(),
        SignalName::new("approval").unwrap(),
        Fence::new(9).unwrap(),
        store.signal_key(),
    );
    assert_refused(
        store.signal(&ahead, b"x").await,
        RunState::Suspended,
        SignalRefusal::UnknownWait,
    );
    assert_eq!(
        store.inspect(&id).await.unwrap().state,
        RunState::Suspended,
        "refusals changed nothing"
    );

    let delivered = store.signal(&first, b"yes").await.unwrap();
    assert_eq!(
        (delivered.run.as_str(), delivered.duplicate),
        ("order-1", false)
    );
    let record = store.inspect(&id).await.unwrap();
    assert_eq!(
        (record.state, record.wait.as_ref()),
        (RunState::Runnable, None)
    );
    // A webhook's retry: the same answer, nothing changed.
    let again = store.signal(&first, b"yes").await.unwrap();
    assert!(again.duplicate);
    assert_refused(
        store.signal(&first, b"no").await,
        RunState::Runnable,
        SignalRefusal::AlreadySignalled,
    );

    let resumed = store.claim(&id, &worker("w2"), long()).await.unwrap();
    assert_eq!(resumed.fence().get(), 2);
    let signal = resumed
        .resumed()
        .and_then(WaitEnd::signal)
        .expect("the lease carries the signal");
    assert_eq!(
        (signal.name.as_str(), signal.payload(), signal.fence.get()),
        ("approval", &b"yes"[..], 1)
    );
    let record = store.inspect(&id).await.unwrap();
    assert_eq!(
        record
            .resumed
            .as_ref()
            .and_then(WaitEnd::signal)
            .map(|s| s.payload()),
        Some(&b"yes"[..])
    );
    // Still a duplicate while the resumed run runs.
    assert!(store.signal(&first, b"yes").await.unwrap().duplicate);

    // It waits again: the first wait's token is refused, even for the same payload.
    let second = wait(&*store, &resumed, "approval", Duration::from_secs(60)).await;
    assert_refused(
        store.signal(&first, b"yes").await,
        RunState::Suspended,
        SignalRefusal::EarlierWait,
    );
    assert!(!store.signal(&second, b"no").await.unwrap().duplicate);
    let third = store.claim(&id, &worker("w3"), long()).await.unwrap();
    assert_eq!(third.fence().get(), 3);
    assert_eq!(
        third
            .resumed()
            .and_then(WaitEnd::signal)
            .map(|s| s.payload()),
        Some(&b"no"[..])
    );
    // A retry of the resumed attempt carries the signal too.
    store.end_one(&third, End::Release).await.unwrap();
    let fourth = store.claim(&id, &worker("w4"), long()).await.unwrap();
    assert_eq!(
        fourth
            .resumed()
            .and_then(WaitEnd::signal)
            .map(|s| s.payload()),
        Some(&b"no"[..])
    );
    store.end_one(&fourth, End::Complete).await.unwrap();
    assert_refused(
        store.signal(&first, b"yes").await,
        RunState::Completed,
        SignalRefusal::NotWaiting,
    );
    assert!(
        store.signal(&second, b"no").await.unwrap().duplicate,
        "a late retry learns it was delivered"
    );
}

/// A wait times out on the store's clock: until its deadline nothing claims the run; after
/// it, a signal is refused as timed out (claimed yet or not), and the next claim takes the run
/// under a higher fence, its lease saying the wait timed out. The wait spent no attempt.
pub async fn a_wait_times_out_on_the_store_clock_and_refuses_a_late_signal(
    factory: &dyn StoreFactory,
) {
    let store = factory.fresh().await;
    if !has_signals(&*store).await {
        return;
    }
    let id = created(&*store, "order-2").await;
    let lease = store.claim(&id, &worker("w1"), long()).await.unwrap();
    let timeout = Duration::from_millis(1500);
    let token = wait(&*store, &lease, "approval", timeout).await;
    assert!(
        store
            .claim_next(&worker("w2"), long(), 10)
            .await
            .unwrap()
            .is_empty(),
        "claimed before its deadline"
    );
    tokio::time::sleep(timeout + Duration::from_millis(500)).await;
    let record = store.inspect(&id).await.unwrap();
    assert!(
        record
            .wait
            .as_ref()
            .is_some_and(|w| w.timed_out(record.observed_at)),
        "{record:?}"
    );
    assert_refused(
        store.signal(&token, b"late").await,
        RunState::Suspended,
        SignalRefusal::TimedOut,
    );
    let leases = store.claim_next(&worker("w2"), long(), 10).await.unwrap();
    assert_eq!(leases.len(), 1, "the timed-out wait is claimable");
    let resumed = &leases[0];
    assert_eq!((resumed.fence().get(), resumed.attempt()), (2, 1));
    match resumed.resumed() {
        Some(WaitEnd::TimedOut { name, fence, .. }) => {
            assert_eq!((name.as_str(), fence.get()), ("approval", 1));
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert_refused(
        store.signal(&token, b"late").await,
        RunState::Runnable,
        SignalRefusal::TimedOut,
    );
    let record = store.inspect(&id).await.unwrap();
    assert!(record
        .resumed
        .as_ref()
        .is_some_and(|r| r.signal().is_none()));
}

/// A signal racing a wait's timeout, a cancel, or another signal: exactly one outcome per run,
/// and what the signal was told agrees with what the run shows.
pub async fn a_signal_racing_a_timeout_or_a_cancel_has_exactly_one_winner(
    factory: &dyn StoreFactory,
) {
    let store = factory.fresh().await;
    if !has_signals(&*store).await {
        return;
    }
    const RUNS: usize = 12;
    let mut tokens = Vec::new();
    for i in 0..RUNS {
        let id = created(&*store, &format!("race-{i}")).await;
        let lease = store.claim(&id, &worker("w"), long()).await.unwrap();
        tokens.push(wait(&*store, &lease, "approval", Duration::from_millis(600)).await);
    }
    // Half raced by a cancel, half by their deadline (signals spread across it) and a claimer.
    let mut tasks = Vec::new();
    for (i, token) in tokens.iter().cloned().enumerate() {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            if i % 2 == 0 {
                let (signal, cancel) = tokio::join!(
                    store.signal(&token, b"go"),
                    store.cancel(token.run(), "order withdrawn")
                );
                cancel.expect("cancel ends a waiting or runnable run");
                (i, signal)
            } else {
                tokio::time::sleep(Duration::from_millis(450 + 25 * i as u64)).await;
                (i, store.signal(&token, b"go").await)
            }
        }));
    }
    let claimer = {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            let mut leases = Vec::new();
            for _ in 0..40 {
                leases.extend(store.claim_next(&worker("c"), long(), 10).await.unwrap());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            leases
        })
    };
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    let leases = claimer.await.unwrap();
    for (i, signal) in outcomes {
        let id = run(&format!("race-{i}"));
        let record = store.inspect(&id).await.unwrap();
        let delivered = record.resumed.as_ref().and_then(WaitEnd::signal).is_some();
        match signal {
            Ok(s) => {
                assert!(
                    !s.duplicate && delivered,
                    "{id}: told delivered, record {record:?}"
                )
            }
            Err(Error::StaleSignal { reason, .. }) => {
                assert!(
                    !delivered,
                    "{id}: refused ({reason:?}) yet the record holds it"
                );
                let expected = if i % 2 == 0 {
                    SignalRefusal::NotWaiting
                } else {
                    SignalRefusal::TimedOut
                };
                assert_eq!(reason, expected, "{id}");
            }
            Err(e) => panic!("{id}: {e}"),
        }
        if i % 2 == 0 {
            assert_eq!(record.state, RunState::Cancelled, "{id}");
        } else {
            // Claimed by now (its wait ended one way or the other), under fence 2.
            let lease = leases
                .iter()
                .find(|l| l.run() == &id)
                .unwrap_or_else(|| panic!("{id} was never claimed"));
            assert_eq!(lease.fence().get(), 2);
            assert_eq!(
                lease.resumed().and_then(WaitEnd::signal).is_some(),
                delivered,
                "{id}"
            );
        }
    }
}

/// A waiting run is live: retention does not purge it. Once cancelled and purged, its token
/// finds no run, and the id created again waits under higher fences, which the old token does
/// not name. An operator's resume ends a wait unanswered. Bad input changes nothing.
pub async fn a_waiting_run_is_resumed_cancelled_or_purged_and_its_token_goes_stale(
    factory: &dyn StoreFactory,
) {
    let store = factory.fresh().await;
    if !has_signals(&*store).await {
        return;
    }
    let id = created(&*store, "order-3").await;
    let lease = store.claim(&id, &worker("w"), long()).await.unwrap();
    // Bad input, before any I/O.
    for timeout in [
        Duration::ZERO,
        Duration::from_micros(1500),
        lease_core::MAX_WAIT + Duration::from_secs(1),
    ] {
        assert!(matches!(
            End::await_signal("approval", timeout),
            Err(Error::InvalidInput(InvalidInput::WaitTimeout { .. }))
        ));
    }
    assert!(End::await_signal("", Duration::from_secs(1)).is_err());
    let token = wait(&*store, &lease, "approval", Duration::from_secs(60)).await;
    let big = vec![0u8; MAX_SIGNAL_PAYLOAD_BYTES + 1];
    assert!(matches!(
        store.signal(&token, &big).await,
        Err(Error::InvalidInput(
            InvalidInput::SignalPayloadTooLarge { .. }
        ))
    ));
    assert_eq!(store.inspect(&id).await.unwrap().state, RunState::Suspended);
    // Exactly at the bound is delivered.
    assert!(!store.signal(&token, &big[1..]).await.unwrap().duplicate);
    let lease = store.claim(&id, &worker("w"), long()).await.unwrap();
    assert_eq!(
        lease
            .resumed()
            .and_then(WaitEnd::signal)
            .map(|s| s.payload().len()),
        Some(MAX_SIGNAL_PAYLOAD_BYTES)
    );

    // An operator's resume ends a wait with no answer.
    let token = wait(&*store, &lease, "approval", Duration::from_secs(60)).await;
    store.resume(&id).await.unwrap();
    assert_refused(
        store.signal(&token, b"yes").await,
        RunState::Runnable,
        SignalRefusal::NotWaiting,
    );
    let lease = store.claim(&id, &worker("w"), long()).await.unwrap();
    assert_eq!(lease.resumed(), None);
    let old = wait(&*store, &lease, "approval", Duration::from_secs(60)).await;
    let old_fence = old.fence().get();

    // Retention leaves a waiting run alone; a cancelled one goes, and its token finds nothing.
    assert!(store
        .purge_ids(std::slice::from_ref(&id))
        .await
        .unwrap()
        .is_empty());
    store.cancel(&id, "withdrawn").await.unwrap();
    assert_refused(
        store.signal(&old, b"yes").await,
        RunState::Cancelled,
        SignalRefusal::NotWaiting,
    );
    assert_eq!(
        store.purge_ids(std::slice::from_ref(&id)).await.unwrap(),
        std::slice::from_ref(&id)
    );
    assert!(matches!(
        store.signal(&old, b"yes").await,
        Err(Error::NotFound { .. })
    ));
    store.create(&id).await.unwrap();
    let lease = store.claim(&id, &worker("w"), long()).await.unwrap();
    assert!(
        lease.fence().get() > old_fence,
        "a purged id never starts below its fence"
    );
    let _new = wait(&*store, &lease, "approval", Duration::from_secs(60)).await;
    assert_refused(
        store.signal(&old, b"yes").await,
        RunState::Suspended,
        SignalRefusal::EarlierWait,
    );
    assert_eq!(store.inspect(&id).await.unwrap().state, RunState::Suspended);
}

/// A signal that comes while the lease of its token still holds the run (the handler handed
/// the token out and has not ended yet) is kept for that lease's wait: the run stays held, and
/// when the lease ends waiting for that name the wait is answered at once (claimable, with the
/// signal). A second, different signal for that lease is refused; the same one again is a
/// duplicate. A fence the holder does not have is refused as ever.
pub async fn a_signal_that_comes_before_its_wait_is_stored_answers_it(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    if !has_signals(&*store).await {
        return;
    }
    let id = created(&*store, "order-4").await;
    let lease = store.claim(&id, &worker("w1"), long()).await.unwrap();
    let early = token(&*store, &lease, "approval");
    assert!(!store.signal(&early, b"yes").await.unwrap().duplicate);
    assert!(store.signal(&early, b"yes").await.unwrap().duplicate);
    assert_refused(
        store.signal(&early, b"no").await,
        RunState::Runnable,
        SignalRefusal::AlreadySignalled,
    );
    let other = token(&*store, &lease, "payment");
    assert_refused(
        store.signal(&other, b"x").await,
        RunState::Runnable,
        SignalRefusal::OtherSignal,
    );
    let record = store.inspect(&id).await.unwrap();
    assert_eq!(
        (record.state, record.owner.is_some()),
        (RunState::Runnable, true),
        "still held"
    );
    store.renew(&lease).await.expect("the lease is untouched");

    store
        .end_one(
            &lease,
            End::await_signal("approval", Duration::from_secs(60)).unwrap(),
        )
        .await
        .unwrap();
    let record = store.inspect(&id).await.unwrap();
    assert_eq!(
        (record.state, record.wait.as_ref()),
        (RunState::Runnable, None),
        "answered as it began"
    );
    let leases = store.claim_next(&worker("w2"), long(), 10).await.unwrap();
    assert_eq!(leases.len(), 1);
    assert_eq!((leases[0].fence().get(), leases[0].attempt()), (2, 1));
    assert_eq!(
        leases[0]
            .resumed()
            .and_then(WaitEnd::signal)
            .map(|s| s.payload()),
        Some(&b"yes"[..])
    );
    assert!(store.signal(&early, b"yes").await.unwrap().duplicate);
    // Nothing holds fence 1 now: a signal for it finds no wait.
    assert_refused(
        store.signal(&other, b"x").await,
        RunState::Runnable,
        SignalRefusal::NotWaiting,
    );
}

/// Through a `Worker` (a runtime scenario, on paused time): a handler takes its wait's token
/// and waits, holding no slot meanwhile; a signal wakes the kind's worker, and the resumed
/// handler reads the payload under a higher fence, on the attempt budget's first attempt. A
/// second run's wait times out: its handler is resumed within a poll of the deadline and told
/// it timed out, with no signal.
pub async fn a_worker_handler_waits_for_a_signal_and_resumes_with_it(factory: &dyn StoreFactory) {
    use lease_runtime::{CancellationToken, RunContext, Worker, WorkerConfig};
    use tokio::sync::mpsc;

    let store = factory.fresh().await;
    if !has_signals(&*store).await {
        return;
    }
    for id in ["approved", "forgotten"] {
        store.create(&run(id)).await.unwrap();
    }
    let (seen, mut events) = mpsc::unbounded_channel();
    let config = WorkerConfig::new(long()).with_concurrency(1);
    let w = Worker::new(store.clone(), worker("w"), config).unwrap();
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let handler = move |ctx: RunContext| {
        let seen = seen.clone();
        async move {
            let id = ctx.run().to_string();
            let what = if let Some(s) = ctx.signal("approval") {
                format!(
                    "signal {} at fence {}",
                    String::from_utf8_lossy(s.payload()),
                    ctx.fence()
                )
            } else if ctx.wait_timed_out("approval") {
                format!("timed out at fence {}", ctx.fence())
            } else {
                let token = ctx.signal_token("approval")?;
                let timeout = if id == "forgotten" { 2 } else { 3600 };
                seen.send((
                    id,
                    format!("waits at fence {} attempt {}", ctx.fence(), ctx.attempt()),
                    Some(token),
                ))
                .unwrap();
                return Ok(End::await_signal("approval", Duration::from_secs(timeout))?);
            };
            seen.send((id, format!("{what}, attempt {}", ctx.attempt()), None))
                .unwrap();
            Ok(End::Complete)
        }
    };
    let handle = tokio::spawn(async move { w.run(handler, stop).await });
    let mut tokens = std::collections::HashMap::new();
    let mut log = Vec::new();
    while tokens.len() < 2 {
        let (id, what, token) = tokio::time::timeout(Duration::from_secs(10), events.recv())
            .await
            .expect("both runs wait")
            .unwrap();
        log.push(format!("{id}: {what}"));
        tokens.insert(id, token.expect("a waiting event"));
    }
    // Concurrency 1: both waited, so a wait holds no slot.
    assert!(
        !store
            .signal(&tokens["approved"], b"yes")
            .await
            .unwrap()
            .duplicate
    );
    while log.len() < 4 {
        let (id, what, _) = tokio::time::timeout(Duration::from_secs(10), events.recv())
            .await
            .expect("both runs resume")
            .unwrap();
        log.push(format!("{id}: {what}"));
    }
    shutdown.cancel();
    handle.await.unwrap().unwrap();
    log.sort();
    assert_eq!(
        log,
        [
            "approved: signal yes at fence 2, attempt 1",
            "approved: waits at fence 1 attempt 1",
            "forgotten: timed out at fence 2, attempt 1",
            "forgotten: waits at fence 1 attempt 1",
        ]
    );
    for id in ["approved", "forgotten"] {
        assert_eq!(
            store.inspect(&run(id)).await.unwrap().state,
            RunState::Completed
        );
    }
}
