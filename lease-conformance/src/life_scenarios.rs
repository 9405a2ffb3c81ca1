//! A run's whole life past its first claim: retry delays on the store's clock, terminal
//! failure, an operator putting a failed run back, and the Worker's retry policy.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_core::{
    End, Ended, Error, InvalidInput, LeaseStore, LeaseStoreExt, ListFilter, RunState, Ttl,
    MAX_REASON_BYTES, MAX_RETRY_DELAY,
};
use lease_runtime::{CancellationToken, RetryPolicy, RunContext, Worker, WorkerConfig};
use tokio::time::Instant;

use crate::scenarios::{created, long, worker};
use crate::StoreFactory;

/// The delay the scenarios wait out, at scale 1 (stretched by [`crate::Timing::ttl`]): long enough
/// that a claim attempted right after the end surely lands inside it, short enough to wait.
const BASE_DELAY_MS: u64 = 400;

/// `RetryAfter` releases the run but no claim takes it before the delay has passed on the
/// store's clock: `claim` is refused as `Delayed` with the time left, `claim_next` passes it
/// by (and hands it out once the delay is over, at the next fence), the record shows when it
/// becomes claimable, and the old lease's writes are refused as released. A zero delay is a
/// plain release; a delay over the maximum is refused before the store and changes nothing;
/// `force_release` ends a delay at once.
pub async fn a_retry_delay_holds_the_run_back_on_the_store_clock(factory: &dyn StoreFactory) {
    // A delay is timed by the store like a TTL, so it stretches with the store's TTLs.
    let store = factory.fresh().await;
    let delay = crate::timing(&*store).ttl(BASE_DELAY_MS).as_duration();
    let r = created(&*store, "retry").await;
    let first = store.claim(&r, &worker("a"), long()).await.unwrap();

    // Bad input first: refused, the lease still held.
    let too_long = MAX_RETRY_DELAY + Duration::from_millis(1);
    assert!(matches!(
        store.retry_after(&first, too_long).await,
        Err(Error::InvalidInput(InvalidInput::RetryDelayTooLong { .. }))
    ));
    store
        .renew(&first)
        .await
        .expect("a refused end changes nothing");

    let sent = Instant::now();
    store.retry_after(&first, delay).await.unwrap();
    let record = store.inspect(&r).await.unwrap();
    assert_eq!(
        (record.state, record.owner.as_ref(), record.expires_at),
        (RunState::Runnable, None, None)
    );
    let not_before = record
        .not_before
        .expect("a delayed run says when it is claimable");
    let left = not_before.saturating_since(record.observed_at);
    assert!(
        !left.is_zero() && left <= delay,
        "claimable in {left:?} after a delay of {delay:?}"
    );
    match store.claim(&r, &worker("b"), long()).await {
        Err(Error::Delayed { run, remaining }) => {
            assert_eq!(run, r);
            assert!(!remaining.is_zero() && remaining <= delay, "{remaining:?}");
        }
        other => panic!("a claim inside the delay answered {other:?}"),
    }
    assert!(
        store
            .claim_next(&worker("b"), long(), 10)
            .await
            .unwrap()
            .is_empty(),
        "claim_next handed out a delayed run"
    );
    assert!(matches!(
        store.renew(&first).await,
        Err(Error::LeaseEnded {
            ended: Ended::Released,
            fence: 1,
            ..
        })
    ));
    // A retry of the end learns its first result.
    assert!(matches!(
        store.retry_after(&first, delay).await,
        Err(Error::LeaseEnded {
            ended: Ended::Released,
            fence: 1,
            ..
        })
    ));

    // Handed out once the delay is over, and not before it could have passed.
    let lag = crate::timing(&*store).capabilities().max_expiry_lag;
    let deadline = sent + delay + lag + Duration::from_secs(5);
    let second = loop {
        let got = store.claim_next(&worker("b"), long(), 10).await.unwrap();
        // The store judged the claim at some instant before it answered, and no earlier than
        // the end was sent plus the delay: the answer is the latest that instant can be. (The
        // instant the call was sent is no bound: a loaded machine may hold the request for
        // tens of milliseconds before the store runs it, as one CI run saw: 368 ms of 400.)
        let returned = Instant::now();
        if let Some(lease) = got.into_iter().next() {
            assert!(
                returned + Duration::from_millis(5) >= sent + delay,
                "claimed and answered {:?} after the end was sent, inside a delay of {delay:?}",
                returned - sent
            );
            break lease;
        }
        assert!(Instant::now() < deadline, "the delayed run never came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!((second.run(), second.fence().get()), (&r, 2));
    let record = store.inspect(&r).await.unwrap();
    // Claimed twice; the snooze gave its attempt back.
    assert_eq!((record.claims(), record.attempts), (2, 1));

    // A zero delay is a release: claimable at once.
    store.retry_after(&second, Duration::ZERO).await.unwrap();
    assert_eq!(store.inspect(&r).await.unwrap().not_before, None);
    let third = store.claim(&r, &worker("c"), long()).await.unwrap();
    assert_eq!(third.fence().get(), 3);

    // force_release ends a delay at once.
    store
        .retry_after(&third, Duration::from_secs(3600))
        .await
        .unwrap();
    assert!(matches!(
        store.claim(&r, &worker("d"), long()).await,
        Err(Error::Delayed { .. })
    ));
    let released = store.force_release(&r).await.unwrap();
    assert_eq!(released.not_before, None);
    assert_eq!(
        store
            .claim(&r, &worker("d"), long())
            .await
            .unwrap()
            .fence()
            .get(),
        4
    );
}

/// `Fail` gives up on a run: failed with its reason, never claimed (`claim` refused as
/// `Failed`, `claim_next` passes it by, `force_release` refused), the old lease's writes
/// refused as ended by a failure, listed by state; `resume` puts it back (reason cleared) and
/// the next claim takes the next fence. A reason over the limit is refused before the store
/// and changes nothing.
pub async fn a_failed_run_stays_failed_until_an_operator_resumes_it(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let r = created(&*store, "poison").await;
    let lease = store.claim(&r, &worker("a"), long()).await.unwrap();
    let huge = "x".repeat(MAX_REASON_BYTES + 1);
    assert!(matches!(
        store.fail(&lease, &huge).await,
        Err(Error::InvalidInput(InvalidInput::ReasonTooLong { .. }))
    ));
    store
        .renew(&lease)
        .await
        .expect("a refused end changes nothing");

    let reason = "card declined: {ä} 'quoted' \n second line";
    store.fail(&lease, reason).await.unwrap();
    let record = store.inspect(&r).await.unwrap();
    assert_eq!(
        (
            record.state,
            record.owner.as_ref(),
            record.failure.as_deref()
        ),
        (RunState::Failed, None, Some(reason))
    );
    assert!(matches!(
        store.claim(&r, &worker("b"), long()).await,
        Err(Error::Failed { run }) if run == r
    ));
    assert!(store
        .claim_next(&worker("b"), long(), 10)
        .await
        .unwrap()
        .is_empty());
    assert!(matches!(
        store.append(&lease, b"late").await,
        Err(Error::LeaseEnded {
            ended: Ended::Failed,
            fence: 1,
            ..
        })
    ));
    assert!(matches!(
        store.fail(&lease, reason).await,
        Err(Error::LeaseEnded {
            ended: Ended::Failed,
            fence: 1,
            ..
        })
    ));
    assert!(matches!(
        store.force_release(&r).await,
        Err(Error::Failed { .. })
    ));
    let failed = store
        .list(&ListFilter::new().with_state(Some(RunState::Failed)))
        .await
        .unwrap();
    assert_eq!(
        failed.iter().map(|f| &f.run).collect::<Vec<_>>(),
        [&r],
        "list --state failed"
    );
    let many = store.inspect_many(std::slice::from_ref(&r)).await.unwrap();
    assert_eq!(many[0].as_ref().unwrap().failure.as_deref(), Some(reason));

    let resumed = store.resume(&r).await.unwrap();
    assert_eq!((resumed.state, resumed.failure), (RunState::Runnable, None));
    assert!(matches!(
        store.resume(&r).await,
        Err(Error::NotSuspended {
            state: RunState::Runnable,
            ..
        })
    ));
    let again = store.claim_next(&worker("b"), long(), 10).await.unwrap();
    assert_eq!(
        again
            .iter()
            .map(|l| (l.run(), l.fence().get()))
            .collect::<Vec<_>>(),
        [(&r, 2)]
    );
}

/// A handler that always fails (a poison run) under `max_attempts = 5` and a 50 ms backoff
/// runs exactly five times, each under the next fence, with growing delays between attempts,
/// then the run is failed with the last error as its reason; the store saw five claims.
pub async fn worker_gives_up_on_a_poison_run_after_its_attempts(factory: &dyn StoreFactory) {
    // Backoff delays are timed by the store like TTLs, so they stretch with them.
    let store = factory.fresh().await;
    let t = crate::timing(&*store);
    let r = created(&*store, "poison").await;
    let attempts: Arc<Mutex<Vec<(u64, Instant)>>> = Arc::default();
    let config = WorkerConfig::new(Ttl::from_secs(30).unwrap())
        .with_poll_interval(Duration::from_millis(10))
        .with_retry(
            RetryPolicy::default()
                .with_backoff(
                    t.scale(Duration::from_millis(50)),
                    t.scale(Duration::from_secs(1)),
                )
                .with_max_attempts(5),
        );
    let w = Worker::new(store.clone(), worker("poisoned"), config).unwrap();
    let seen = attempts.clone();
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let handle = tokio::spawn(async move {
        w.run(
            move |ctx: RunContext| {
                let seen = seen.clone();
                async move {
                    let attempt = ctx.fence().get();
                    seen.lock().unwrap().push((attempt, Instant::now()));
                    Err::<End, _>(format!("card declined (attempt {attempt})").into())
                }
            },
            stop,
        )
        .await
    });
    let deadline = Instant::now() + t.scale(Duration::from_secs(20));
    while state_failed(&*store, &r).await.is_none() {
        assert!(Instant::now() < deadline, "the poison run never failed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Nothing more may happen to it: give a sixth attempt the time it would need.
    tokio::time::sleep(t.scale(Duration::from_millis(300))).await;
    shutdown.cancel();
    let report = handle.await.unwrap().unwrap();
    let attempts = attempts.lock().unwrap().clone();
    assert_eq!(
        attempts.iter().map(|(a, _)| *a).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5],
        "one handler run per attempt, each under the next fence"
    );
    // Each delay is at least half of 50 ms x 2^(n-1), counted on the store's clock from the
    // end's commit, which comes after the handler returned.
    for (n, pair) in attempts.windows(2).enumerate() {
        let gap = pair[1].1 - pair[0].1;
        let least = t.scale(Duration::from_millis(25 << n));
        assert!(
            gap + Duration::from_millis(5) >= least,
            "attempt {} came {gap:?} after attempt {}: under the backoff's {least:?}",
            n + 2,
            n + 1
        );
    }
    let record = store.inspect(&r).await.unwrap();
    assert_eq!(
        (record.state, record.fence.get(), record.failure.as_deref()),
        (RunState::Failed, 5, Some("card declined (attempt 5)"))
    );
    assert_eq!(
        (
            report.claimed,
            report.handler_errors,
            report.gave_up,
            report.released
        ),
        (5, 5, 1, 4),
        "{report:?}"
    );
}

async fn state_failed(store: &dyn LeaseStore, r: &lease_core::RunId) -> Option<()> {
    (store.inspect(r).await.unwrap().state == RunState::Failed).then_some(())
}

/// Retention: `purge` removes completed and failed runs whose end is older than the age asked,
/// oldest end first, at most `max` per call, with their journals; runnable, held, suspended and
/// resumed runs stay; `count_purgeable` counts what it would remove. A purged id created again
/// starts at its last fence, so its next claim continues above every fence it issued and a
/// holder of an old lease is refused. Bad input is refused before the store.
pub async fn purge_removes_old_ended_runs_and_never_reuses_a_fence(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let done = created(&*store, "done").await;
    let lease = store.claim(&done, &worker("a"), long()).await.unwrap();
    store.complete_with(&lease, b"effect").await.unwrap();

    // "gave-up" is claimed three times (fence 3) and failed.
    let gave_up = created(&*store, "gave-up").await;
    for _ in 0..2 {
        let l = store.claim(&gave_up, &worker("a"), long()).await.unwrap();
        store.release(&l).await.unwrap();
    }
    let last = store.claim(&gave_up, &worker("a"), long()).await.unwrap();
    store.fail(&last, "no such card").await.unwrap();
    // Failed and resumed: live again, not purged.
    let revived = created(&*store, "revived").await;
    let l = store.claim(&revived, &worker("a"), long()).await.unwrap();
    store.fail(&l, "transient").await.unwrap();
    store.resume(&revived).await.unwrap();
    let waiting = created(&*store, "waiting").await;
    let held = created(&*store, "held").await;
    let _holding = store.claim(&held, &worker("h"), long()).await.unwrap();
    let parked = created(&*store, "parked").await;
    let l = store.claim(&parked, &worker("a"), long()).await.unwrap();
    store.suspend(&l).await.unwrap();

    assert!(matches!(
        store.purge(Duration::ZERO, 0).await,
        Err(Error::InvalidInput(InvalidInput::BatchEmpty))
    ));
    assert!(matches!(
        store
            .purge(lease_core::MAX_PURGE_AGE + Duration::from_secs(1), 10)
            .await,
        Err(Error::InvalidInput(InvalidInput::PurgeAgeTooLong { .. }))
    ));
    let hour = Duration::from_secs(3600);
    assert_eq!(store.count_purgeable(hour).await.unwrap(), 0);
    assert!(
        store.purge(hour, 10).await.unwrap().is_empty(),
        "runs that ended a moment ago are younger than an hour"
    );
    // Ends are stamped by the store's clock, which ticks at the store's own resolution.
    let t = crate::timing(&*store);
    tokio::time::sleep(t.scale(Duration::from_millis(50))).await;
    let age = t.scale(Duration::from_millis(20));
    assert_eq!(store.count_purgeable(age).await.unwrap(), 2);
    // Oldest end first, at most max per call.
    assert_eq!(
        store.purge(age, 1).await.unwrap(),
        std::slice::from_ref(&done)
    );
    assert_eq!(
        store.purge(age, 10).await.unwrap(),
        std::slice::from_ref(&gave_up)
    );
    assert!(store.purge(age, 10).await.unwrap().is_empty());
    assert_eq!(store.count_purgeable(Duration::ZERO).await.unwrap(), 0);
    for gone in [&done, &gave_up] {
        assert!(matches!(
            store.inspect(gone).await,
            Err(Error::NotFound { .. })
        ));
        assert!(matches!(
            store.journal(gone).await,
            Err(Error::NotFound { .. })
        ));
    }
    for (id, state) in [
        (&revived, RunState::Runnable),
        (&waiting, RunState::Runnable),
        (&held, RunState::Runnable),
        (&parked, RunState::Suspended),
    ] {
        assert_eq!(store.inspect(id).await.unwrap().state, state, "{id} stays");
    }

    // Created again: it starts at its last fence, never below.
    let again = store.create(&gave_up).await.unwrap();
    assert_eq!((again.fence.get(), again.state), (3, RunState::Runnable));
    assert!(store.journal(&gave_up).await.unwrap().is_empty());
    assert!(matches!(
        store.append(&last, b"late").await,
        Err(Error::LeaseEnded { fence: 3, .. })
    ));
    let next = store.claim(&gave_up, &worker("b"), long()).await.unwrap();
    assert_eq!(
        next.fence().get(),
        4,
        "the next claim continues above the purged run's"
    );
    assert!(matches!(
        store.append(&last, b"late").await,
        Err(Error::StaleFence {
            presented: 3,
            current: 4,
            ..
        })
    ));
    let many = store
        .create_many(std::slice::from_ref(&done))
        .await
        .unwrap();
    assert!(many[0].is_ok());
    // Every run starts at the fence floor, the highest fence purged (gave-up's 3), above
    // done's own last fence (1).
    assert_eq!(store.inspect(&done).await.unwrap().fence.get(), 3);
    // Purged twice: the floor keeps the highest fence.
    let l = store.claim(&done, &worker("c"), long()).await.unwrap();
    assert_eq!(l.fence().get(), 4);
    store.complete(&l).await.unwrap();
    assert_eq!(
        store.purge(Duration::ZERO, 10).await.unwrap(),
        std::slice::from_ref(&done)
    );
    assert_eq!(store.create(&done).await.unwrap().fence.get(), 4);
    let fresh = created(&*store, "never-seen").await;
    assert_eq!(
        store.inspect(&fresh).await.unwrap().fence.get(),
        4,
        "an id never used before starts at the floor too"
    );
}

/// The purge benchmark (not a conformance scenario: run by the backends' ignored
/// `purge_load` tests): 100,000 completed runs purged 1,000 per call while a loop renews
/// 1,000 held leases with `renew_many` every 50 ms, as a heartbeat hub does. Returns a line of
/// figures: renewal latency before and during the purge (p50, p99, worst), the purge's wall
/// time and calls. Panics if a renewal is refused or a run is left.
pub async fn purge_under_load(store: Arc<dyn LeaseStore>) -> String {
    const ENDED: usize = 100_000;
    const HELD: usize = 1_000;
    let ids: Vec<lease_core::RunId> = (0..ENDED)
        .map(|i| lease_core::RunId::new(format!("done-{i:06}")).unwrap())
        .collect();
    for chunk in ids.chunks(lease_core::MAX_BATCH) {
        store.create_many(chunk).await.unwrap();
    }
    let filler = worker("filler");
    let mut completed = 0;
    while completed < ENDED {
        let leases = store.claim_next(&filler, long(), 1_000).await.unwrap();
        assert!(!leases.is_empty(), "ran out of runs at {completed}");
        completed += leases.len();
        for result in store.complete_many(&leases).await.unwrap() {
            result.unwrap();
        }
    }
    let held_ids: Vec<lease_core::RunId> = (0..HELD)
        .map(|i| lease_core::RunId::new(format!("held-{i:04}")).unwrap())
        .collect();
    store.create_many(&held_ids).await.unwrap();
    let holder = worker("hub");
    let leases = Arc::new(store.claim_next(&holder, long(), HELD).await.unwrap());
    assert_eq!(leases.len(), HELD);

    let purging = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = CancellationToken::new();
    let renewer = {
        let (store, leases, purging, stop) =
            (store.clone(), leases.clone(), purging.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut before, mut during) = (Vec::new(), Vec::new());
            while !stop.is_cancelled() {
                let sent = Instant::now();
                let was = purging.load(std::sync::atomic::Ordering::SeqCst);
                for result in store.renew_many(&leases).await.unwrap() {
                    result.expect("a held lease's renewal is refused");
                }
                let took = sent.elapsed();
                if was && purging.load(std::sync::atomic::Ordering::SeqCst) {
                    during.push(took);
                } else if !was {
                    before.push(took);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (before, during)
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    purging.store(true, std::sync::atomic::Ordering::SeqCst);
    let started = Instant::now();
    let (mut purged, mut calls) = (0, 0);
    loop {
        let batch = store.purge(Duration::ZERO, 1_000).await.unwrap();
        calls += 1;
        purged += batch.len();
        if batch.len() < 1_000 {
            break;
        }
    }
    let wall = started.elapsed();
    purging.store(false, std::sync::atomic::Ordering::SeqCst);
    stop.cancel();
    let (mut before, mut during) = renewer.await.unwrap();
    assert_eq!(purged, ENDED, "every completed run is purged");
    assert_eq!(store.count_purgeable(Duration::ZERO).await.unwrap(), 0);
    let stats = |v: &mut Vec<Duration>| {
        v.sort();
        let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize];
        format!(
            "{} renewals: p50 {:.1?} p99 {:.1?} worst {:.1?}",
            v.len(),
            at(0.5),
            at(0.99),
            v[v.len() - 1]
        )
    };
    format!(
        "purge of {ENDED} completed runs, 1,000 per call: {calls} calls in {wall:.2?} ({:.0} runs/s); \
         renew_many of {HELD} leases every 50 ms — before: {}; during: {}",
        ENDED as f64 / wall.as_secs_f64(),
        stats(&mut before),
        stats(&mut during)
    )
}

/// How often a poison run (its handler always fails) is claimed under `policy`, in claims per
/// second over `window`, with one Worker: the figure for the retry policy's closing note
/// (run by the backends' ignored `purge_load` tests). An immediate release (the Worker before
/// retry policies) is `RetryPolicy::default().with_backoff(ZERO, ZERO).without_max_attempts()`.
pub async fn poison_claim_rate(
    store: Arc<dyn LeaseStore>,
    policy: RetryPolicy,
    window: Duration,
) -> f64 {
    let r = created(&*store, "poison").await;
    let config = WorkerConfig::new(Ttl::from_secs(30).unwrap())
        .with_poll_interval(Duration::from_millis(10))
        .with_retry(policy);
    let w = Worker::new(store.clone(), worker("poisoned"), config).unwrap();
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let handle = tokio::spawn(async move {
        w.run(
            |_ctx: RunContext| async { Err::<End, _>("always fails".into()) },
            stop,
        )
        .await
    });
    tokio::time::sleep(window).await;
    shutdown.cancel();
    handle.await.unwrap().unwrap();
    let claims = store.inspect(&r).await.unwrap().claims();
    claims as f64 / window.as_secs_f64()
}

/// `count` says how many runs are claimable (fresh, released past a delay, or whose lease
/// expired), held, delayed, suspended, completed and failed, and follows them as they move:
/// a resume, a force-release that ends a delay, a purge.
pub async fn count_tells_how_many_runs_are_in_each_state(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let t = crate::timing(&*store);
    let short = t.short_ttl();
    for name in [
        "fresh-1", "fresh-2", "expired", "held", "delayed", "parked", "done-1", "done-2", "failed",
    ] {
        created(&*store, name).await;
    }
    let id = |name: &str| lease_core::RunId::new(name).unwrap();
    let w = worker("w");
    store.claim(&id("expired"), &w, short).await.unwrap();
    let _held = store.claim(&id("held"), &w, long()).await.unwrap();
    let l = store.claim(&id("delayed"), &w, long()).await.unwrap();
    store
        .retry_after(&l, Duration::from_secs(3600))
        .await
        .unwrap();
    let l = store.claim(&id("parked"), &w, long()).await.unwrap();
    store.suspend(&l).await.unwrap();
    for name in ["done-1", "done-2"] {
        let l = store.claim(&id(name), &w, long()).await.unwrap();
        store.complete(&l).await.unwrap();
    }
    let l = store.claim(&id("failed"), &w, long()).await.unwrap();
    store.fail(&l, "gave up").await.unwrap();
    crate::until_expired(&*store, &id("expired"), t).await;
    assert_eq!(figures(store.count().await.unwrap()), (3, 1, 1, 1, 2, 1));

    store.resume(&id("parked")).await.unwrap();
    store.force_release(&id("delayed")).await.unwrap();
    store.resume(&id("failed")).await.unwrap();
    assert_eq!(figures(store.count().await.unwrap()), (6, 1, 0, 0, 2, 0));
    assert_eq!(store.purge(Duration::ZERO, 10).await.unwrap().len(), 2);
    assert_eq!(store.count().await.unwrap().completed, 0);
}

/// A count's figures in the order claimable, held, delayed, suspended, completed, failed.
fn figures(counts: lease_core::RunCounts) -> (u64, u64, u64, u64, u64, u64) {
    (
        counts.claimable,
        counts.held,
        counts.delayed,
        counts.suspended,
        counts.completed,
        counts.failed,
    )
}
