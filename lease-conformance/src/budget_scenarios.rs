//! The attempt budget and the attempt deadline: a run whose holder crashes or hangs on every
//! attempt stops; a run that waits on people, deploys or snoozes keeps its budget.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_core::{End, Ended, Error, Lease, LeaseStore, LeaseStoreExt, RunId, RunState, Ttl};
use lease_runtime::{
    CancellationToken, Fault, FaultyStore, RetryPolicy, RunContext, Worker, WorkerConfig,
    WorkerReport,
};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::scenarios::{created, long, worker};
use crate::StoreFactory;

/// A policy that retries at once (a 1 ms backoff) and gives up at `max`.
fn quick(max: u64) -> RetryPolicy {
    RetryPolicy::default()
        .with_backoff(Duration::from_millis(1), Duration::from_millis(1))
        .with_max_attempts(max)
}

/// Waits until `run` is in `state`, or fails the test after `within`.
async fn until_state(store: &dyn LeaseStore, run: &RunId, state: RunState, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let record = store.inspect(run).await.expect("inspect");
        if record.state == state {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{run} is {} (attempts {}, fence {}), not {state}, after {within:?}",
            record.state,
            record.attempts,
            record.fence
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A handler that crashes its worker process on every claim (the process vanishes: no
/// renewal, no end, no release), `max_attempts = 3`, a short TTL: the handler runs exactly
/// three times, and the fourth claim fails the run without running it, with a reason that
/// says so. Each "process" is a Worker whose link to the store goes dead when its handler
/// starts, then is dropped.
pub async fn a_handler_that_crashes_every_attempt_fails_the_run_after_its_budget(
    factory: &dyn StoreFactory,
) {
    let store = factory.fresh().await;
    let t = crate::timing(&*store);
    let r = created(&*store, "crashes").await;
    let started = Arc::new(AtomicU64::new(0));
    for process in 0..6 {
        let crashed = crashing_process(&store, &r, process, t.ttl(400), quick(3), &started).await;
        if !crashed {
            break;
        }
    }
    let record = store.inspect(&r).await.unwrap();
    assert_eq!(
        started.load(Ordering::SeqCst),
        3,
        "the handler ran once per attempt of the budget, no more"
    );
    assert_eq!(record.state, RunState::Failed, "{record:?}");
    assert_eq!(
        record.claims(),
        4,
        "three attempts, then the claim that failed it"
    );
    let reason = record.failure.clone().unwrap_or_default();
    assert!(
        reason.contains("claimed 3 times without finishing"),
        "{reason}"
    );
    // The history tells the same, attempt by attempt: three crashed holders whose leases
    // expired (each written by the claim that took over), then the claim that failed the run.
    if store.capabilities().attempt_history {
        let history = record.history.clone().expect("the store keeps a history");
        let seen: Vec<(lease_core::AttemptOutcome, u64, u64, String)> = history
            .iter()
            .map(|a| (a.outcome, a.attempt, a.fence.get(), a.worker.to_string()))
            .collect();
        use lease_core::AttemptOutcome::{Expired, Failed};
        assert_eq!(
            seen,
            vec![
                (Expired, 1, 1, "process-0".into()),
                (Expired, 2, 2, "process-1".into()),
                (Expired, 3, 3, "process-2".into()),
                (Failed, 4, 4, "process-3".into()),
            ],
            "{history:#?}"
        );
        assert_eq!(history[3].error.as_deref(), Some(reason.as_str()));
        for pair in history.windows(2) {
            assert!(pair[0].ended_at <= pair[1].claimed_at, "{history:#?}");
        }
    }
}

/// One worker process whose handler crashes it: a Worker whose link to the store goes dead
/// when its handler starts, then dropped. Returns whether the handler started (and the
/// process crashed); `false` when the Worker failed the run without starting it (or nothing
/// became claimable within 30 s of the TTL).
async fn crashing_process(
    store: &Arc<dyn LeaseStore>,
    run: &RunId,
    process: u64,
    ttl: Ttl,
    policy: RetryPolicy,
    started: &Arc<AtomicU64>,
) -> bool {
    let link = FaultyStore::new(store.clone());
    let config = WorkerConfig::new(ttl)
        .with_poll_interval(Duration::from_millis(10))
        .with_retry(policy);
    let w = Worker::new(
        Arc::new(link.clone()) as Arc<dyn LeaseStore>,
        worker(&format!("process-{process}")),
        config,
    )
    .unwrap();
    let crashed = Arc::new(Notify::new());
    let handle = {
        let (link, started, crashed) = (link.clone(), started.clone(), crashed.clone());
        tokio::spawn(async move {
            w.run(
                move |_ctx: RunContext| {
                    let (link, started, crashed) = (link.clone(), started.clone(), crashed.clone());
                    async move {
                        started.fetch_add(1, Ordering::SeqCst);
                        // The process dies here: nothing it sends reaches the store again.
                        link.set(Fault::Hang);
                        crashed.notify_one();
                        std::future::pending::<()>().await;
                        Ok(End::Complete)
                    }
                },
                CancellationToken::new(),
            )
            .await
        })
    };
    // Either its handler starts (and the process crashes), or it fails the run unrun.
    let deadline = Instant::now() + ttl.as_duration() + Duration::from_secs(30);
    let crashed_now = loop {
        tokio::select! {
            () = crashed.notified() => break true,
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
        if store.inspect(run).await.unwrap().state == RunState::Failed {
            break false;
        }
        assert!(
            Instant::now() < deadline,
            "process {process} neither ran nor failed the run"
        );
    };
    handle.abort();
    crashed_now
}

/// The crash benchmark: a run whose handler crashes its worker process on every claim,
/// processes started one after the other for `window`, TTL `ttl`, under `policy`. Returns the
/// claims, the handler starts and the run's state at the end. Without a budget
/// (`without_max_attempts`) the run is claimed again after every TTL for as long as the window
/// lasts; with one, it stops.
pub async fn crash_poison_claims(
    store: Arc<dyn LeaseStore>,
    ttl: Ttl,
    policy: RetryPolicy,
    window: Duration,
) -> (u64, u64, RunState) {
    let r = created(&*store, "crash-poison").await;
    let started = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + window;
    let mut process = 0;
    while Instant::now() < until {
        let run = tokio::time::timeout(
            until.saturating_duration_since(Instant::now()),
            crashing_process(&store, &r, process, ttl, policy, &started),
        )
        .await;
        match run {
            Ok(true) => process += 1,
            Ok(false) | Err(_) => break,
        }
    }
    let record = store.inspect(&r).await.unwrap();
    (
        record.claims(),
        started.load(Ordering::SeqCst),
        record.state,
    )
}

/// The hang benchmark: one Worker whose handler for a run never returns (and ignores its
/// token), for `window`, under `policy`, with `timeout` as its attempt deadline (or none).
/// Returns the claims and the run's state at the end. Without a deadline the hub renews the
/// hung run for as long as the process lives: one claim, never freed.
pub async fn hang_poison_claims(
    store: Arc<dyn LeaseStore>,
    policy: RetryPolicy,
    timeout: Option<Duration>,
    window: Duration,
) -> (u64, RunState) {
    let r = created(&*store, "hang-poison").await;
    let mut config = WorkerConfig::new(Ttl::from_secs(30).unwrap())
        .with_poll_interval(Duration::from_millis(10))
        .with_grace(Duration::from_millis(100))
        .with_retry(policy);
    if let Some(d) = timeout {
        config = config.with_attempt_timeout(d);
    }
    let w = Worker::new(store.clone(), worker("hanging"), config).unwrap();
    let shutdown = CancellationToken::new();
    let handle = {
        let stop = shutdown.clone();
        tokio::spawn(async move {
            w.run(
                |_ctx: RunContext| async move {
                    std::future::pending::<()>().await;
                    Ok(End::Complete)
                },
                stop,
            )
            .await
        })
    };
    tokio::time::sleep(window).await;
    let record = store.inspect(&r).await.unwrap();
    shutdown.cancel();
    let _ = handle.await;
    (record.claims(), record.state)
}

/// A handler that hangs (ignores its token for ever) under `with_attempt_timeout`,
/// `max_attempts = 2`: each attempt is cancelled at its deadline and aborted after the grace,
/// counted as failed, and the run ends failed after two timed-out attempts, in bounded time,
/// while the same Worker completes the other runs. A handler that returns its run once its
/// token is cancelled (an `End::Release` after the deadline) counts as failed too.
pub async fn a_handler_that_hangs_fails_after_its_attempt_deadlines(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let hangs = created(&*store, "hangs").await;
    let gives_back = created(&*store, "gives-back").await;
    let others: Vec<RunId> = (0..5)
        .map(|i| crate::scenarios::run(&format!("fine-{i}")))
        .collect();
    for id in &others {
        store.create(id).await.unwrap();
    }
    let timeout = Duration::from_millis(500);
    let config = WorkerConfig::new(Ttl::from_secs(30).unwrap())
        .with_concurrency(8)
        .with_poll_interval(Duration::from_millis(10))
        .with_grace(Duration::from_millis(100))
        .with_attempt_timeout(timeout)
        .with_retry(quick(2));
    let w = Worker::new(store.clone(), worker("patient"), config).unwrap();
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let handle = {
        let stop = shutdown.clone();
        tokio::spawn(async move {
            w.run(
                |ctx: RunContext| async move {
                    match ctx.run().as_str() {
                        "hangs" => {
                            std::future::pending::<()>().await;
                            Ok(End::Complete)
                        }
                        "gives-back" => {
                            ctx.cancelled().await;
                            Ok(End::Release)
                        }
                        _ => Ok(End::Complete),
                    }
                },
                stop,
            )
            .await
        })
    };
    for id in &others {
        until_state(&*store, id, RunState::Completed, Duration::from_secs(5)).await;
    }
    // Two attempts of (timeout + grace at most), with 1 ms backoffs: well inside 5 s.
    for id in [&hangs, &gives_back] {
        until_state(&*store, id, RunState::Failed, Duration::from_secs(5)).await;
    }
    let took = started.elapsed();
    shutdown.cancel();
    let report: WorkerReport = handle.await.unwrap().unwrap();
    for id in [&hangs, &gives_back] {
        let record = store.inspect(id).await.unwrap();
        assert_eq!(record.claims(), 2, "{id}: two attempts, then failed");
        let reason = record.failure.unwrap_or_default();
        assert!(
            reason.contains("attempt timed out after 500ms"),
            "{id}: {reason}"
        );
    }
    assert_eq!(report.timed_out, 4, "{report:?}");
    assert_eq!(report.completed, 5, "{report:?}");
    assert!(took >= timeout * 2, "failed after {took:?}");
}

/// What does not use an attempt: 30 suspend/resume cycles, 30 graceful shutdowns that hand the
/// run back, 5 snoozes (`End::RetryAfter` chosen by the handler): after each, one failure under
/// `max_attempts = 3` is retried, not failed. A failed run resumed, and a purged id created
/// again, start a fresh budget (the fence goes on rising).
pub async fn the_attempt_budget_counts_failures_not_waits_deploys_or_snoozes(
    factory: &dyn StoreFactory,
) {
    let store = factory.fresh().await;
    let a = worker("a");

    // Suspended and resumed 30 times (the resume resets the budget, the suspend gives the
    // claim back); then a Worker's handler fails once.
    let waits = created(&*store, "waits").await;
    for _ in 0..30 {
        let lease = store.claim(&waits, &a, long()).await.unwrap();
        store.suspend(&lease).await.unwrap();
        store.resume(&waits).await.unwrap();
    }
    // Released by 30 graceful shutdowns of a Worker whose handler was still running.
    let deploys = created(&*store, "deploys").await;
    for n in 0..30 {
        let config = WorkerConfig::new(Ttl::from_secs(30).unwrap())
            .with_poll_interval(Duration::from_millis(5))
            // Long enough for a claim in flight at the shutdown to come back and be released
            // too (one still out at the grace's end is abandoned to its TTL).
            .with_grace(Duration::from_millis(50))
            .with_retry(quick(3));
        let w = Worker::new(store.clone(), worker(&format!("deploy-{n}")), config).unwrap();
        let running = Arc::new(Notify::new());
        let shutdown = CancellationToken::new();
        let handle = {
            let (stop, running) = (shutdown.clone(), running.clone());
            tokio::spawn(async move {
                w.run(
                    move |ctx: RunContext| {
                        let running = running.clone();
                        async move {
                            running.notify_one();
                            ctx.cancelled().await;
                            Err::<End, _>("stopped by the deploy".into())
                        }
                    },
                    stop,
                )
                .await
            })
        };
        tokio::time::timeout(Duration::from_secs(10), running.notified())
            .await
            .expect("the handler started");
        shutdown.cancel();
        let report = handle.await.unwrap().unwrap();
        // Every run it held went back at the shutdown ("waits" too, runnable again).
        assert_eq!(report.released, report.claimed, "deploy {n}: {report:?}");
    }
    let record = store.inspect(&deploys).await.unwrap();
    // At least one claim per deploy (a claim in flight at a shutdown comes back and is
    // released too), and not one attempt spent.
    assert!(record.claims() >= 30, "{record:?}");
    assert_eq!(record.attempts, 0, "{record:?}");
    // Snoozed 5 times by its handler.
    let snoozes = created(&*store, "snoozes").await;
    for _ in 0..5 {
        let lease = claim_when_due(&*store, &snoozes).await;
        store
            .retry_after(&lease, Duration::from_millis(1))
            .await
            .unwrap();
    }
    for id in [&waits, &deploys, &snoozes] {
        let before = store.inspect(id).await.unwrap();
        assert_eq!(before.attempts, 0, "{id}: {before:?}");
        fail_once_under_a_worker(&store, id, 3).await;
        let after = store.inspect(id).await.unwrap();
        assert_eq!(
            (after.state, after.attempts),
            (RunState::Runnable, 1),
            "{id}: one failure is one attempt of three, retried: {after:?}"
        );
    }

    // A run failed by its budget, resumed: `max_attempts` more.
    let resumed = created(&*store, "resumed").await;
    for _ in 0..3 {
        fail_once_under_a_worker(&store, &resumed, 3).await;
    }
    assert_eq!(
        store.inspect(&resumed).await.unwrap().state,
        RunState::Failed
    );
    store.resume(&resumed).await.unwrap();
    for n in 1..=2 {
        fail_once_under_a_worker(&store, &resumed, 3).await;
        let record = store.inspect(&resumed).await.unwrap();
        assert_eq!(
            (record.state, record.attempts),
            (RunState::Runnable, n),
            "after the resume, failure {n} of 3: {record:?}"
        );
    }
    // A purged id created again: a fresh budget, and its fence goes on from the last one.
    let reborn = created(&*store, "reborn").await;
    for _ in 0..3 {
        fail_once_under_a_worker(&store, &reborn, 3).await;
    }
    let old = store.inspect(&reborn).await.unwrap();
    assert_eq!(old.state, RunState::Failed);
    let t = crate::timing(&*store);
    tokio::time::sleep(t.scale(Duration::from_millis(20))).await;
    let purged = store.purge(Duration::ZERO, 100).await.unwrap();
    assert!(purged.contains(&reborn), "{purged:?}");
    let again = store.create(&reborn).await.unwrap();
    assert_eq!((again.attempts, again.fence), (0, old.fence));
    fail_once_under_a_worker(&store, &reborn, 3).await;
    let record = store.inspect(&reborn).await.unwrap();
    assert_eq!((record.state, record.attempts), (RunState::Runnable, 1));
    assert!(record.claims() > old.claims(), "{record:?}");
}

/// Claims `run` as soon as its retry delay is over (a store that times delays in whole seconds
/// holds a 1 ms delay for a second).
async fn claim_when_due(store: &dyn LeaseStore, run: &RunId) -> Lease {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match store.claim(run, &worker("a"), long()).await {
            Ok(lease) => return lease,
            Err(Error::Delayed { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(e) => panic!("claim of {run}: {e}"),
        }
    }
}

/// Runs a Worker (max `max` attempts) until its handler has failed `run` once, then stops it.
async fn fail_once_under_a_worker(store: &Arc<dyn LeaseStore>, run: &RunId, max: u64) {
    let config = WorkerConfig::new(Ttl::from_secs(30).unwrap())
        .with_poll_interval(Duration::from_millis(5))
        .with_retry(quick(max));
    let target = run.clone();
    let ended = Arc::new(Notify::new());
    let w = Worker::new(store.clone(), worker("failer"), config)
        .unwrap()
        .on_end({
            let (ended, target) = (ended.clone(), target.clone());
            move |report| {
                if report.lease.run() == &target {
                    ended.notify_one();
                }
            }
        });
    let shutdown = CancellationToken::new();
    // Once: the Worker may claim the run again (its 1 ms backoff over) before it stops.
    let failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let handle = {
        let stop = shutdown.clone();
        tokio::spawn(async move {
            w.run(
                move |ctx: RunContext| {
                    let (target, failed) = (target.clone(), failed.clone());
                    async move {
                        if ctx.run() == &target && !failed.swap(true, Ordering::SeqCst) {
                            Err::<End, _>("card declined".into())
                        } else {
                            // Not this call's run, or failed once already: leave it for later.
                            Ok(End::Release)
                        }
                    }
                },
                stop,
            )
            .await
        })
    };
    tokio::time::timeout(Duration::from_secs(10), ended.notified())
        .await
        .unwrap_or_else(|_| panic!("the Worker never ended {run}"));
    shutdown.cancel();
    handle.await.unwrap().unwrap();
    // The 1 ms backoff: claimable again before the next call.
    tokio::time::sleep(Duration::from_millis(5)).await;
}

/// A handler that ends its own lease (a plain `complete` here; a transaction of its own in a
/// service), then spends 1.5 heartbeat intervals before returning `End::Committed`: a renewal
/// meets the ended lease meanwhile, and the Worker still reports the run completed once, with
/// `on_end` called with `Ok`, not "refused: lease lost".
pub async fn an_end_the_handler_committed_is_reported_once_after_a_renewal_met_it(
    factory: &dyn StoreFactory,
) {
    let store = factory.fresh().await;
    let t = crate::timing(&*store);
    let r = created(&*store, "self-ended").await;
    let ttl = t.ttl(3_000);
    let heartbeat = ttl.as_duration() / 10;
    let ends: Arc<Mutex<Vec<(String, bool)>>> = Arc::default();
    let config = WorkerConfig::new(ttl)
        .with_poll_interval(Duration::from_millis(10))
        .with_heartbeat(heartbeat);
    let w = Worker::new(store.clone(), worker("self-ender"), config)
        .unwrap()
        .on_end({
            let ends = ends.clone();
            move |report| {
                ends.lock()
                    .unwrap()
                    .push((report.lease.run().to_string(), report.result.is_ok()));
            }
        });
    let shutdown = CancellationToken::new();
    let handle = {
        let stop = shutdown.clone();
        tokio::spawn(async move {
            w.run(
                move |ctx: RunContext| async move {
                    ctx.store().complete(&ctx.lease()).await?;
                    tokio::time::sleep(heartbeat * 3 / 2).await;
                    Ok(End::Committed(Ended::Completed))
                },
                stop,
            )
            .await
        })
    };
    let deadline = Instant::now() + t.scale(Duration::from_secs(10));
    while ends.lock().unwrap().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the Worker never decided the end"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    shutdown.cancel();
    let report = handle.await.unwrap().unwrap();
    assert_eq!(
        *ends.lock().unwrap(),
        [(r.to_string(), true)],
        "on_end once, with Ok"
    );
    assert_eq!(
        (report.completed, report.refused, report.failed),
        (1, 0, 0),
        "{report:?}"
    );
    assert_eq!(store.inspect(&r).await.unwrap().state, RunState::Completed);
}

/// `RunScope` applies the budget too: after two attempts taken from their holders
/// (`force_release` leaves the attempt counted, as an expiry does), `RunScope::claim` with
/// `with_max_attempts(2)` fails the run and answers `AttemptsExhausted`, and
/// `RunScope::claim_next` fails such a run and leaves it out; a run within its budget is
/// handed out as always.
pub async fn a_scope_fails_a_run_claimed_past_its_budget(factory: &dyn StoreFactory) {
    use lease_runtime::{RunScope, ScopeConfig};
    let store = factory.fresh().await;
    let (one, other, fresh) = (
        created(&*store, "scoped-one").await,
        created(&*store, "scoped-other").await,
        crate::scenarios::run("scoped-fresh"),
    );
    let a = worker("a");
    for id in [&one, &other] {
        for _ in 0..2 {
            store.claim(id, &a, long()).await.unwrap();
            store.force_release(id).await.unwrap();
        }
        assert_eq!(store.inspect(id).await.unwrap().attempts, 2);
    }
    let config = ScopeConfig::default().with_max_attempts(2);
    match RunScope::claim(store.clone(), &one, &a, long(), config.clone()).await {
        Err(Error::AttemptsExhausted {
            attempts: 2,
            max: 2,
            ..
        }) => {}
        other => panic!("a run past its budget was handed out: {other:?}"),
    }
    let record = store.inspect(&one).await.unwrap();
    assert_eq!(record.state, RunState::Failed);
    assert!(record
        .failure
        .unwrap_or_default()
        .contains("claimed 2 times without finishing"),);
    store.create(&fresh).await.unwrap();
    let scopes = RunScope::claim_next(store.clone(), &a, long(), 10, config)
        .await
        .unwrap();
    let handed: Vec<&RunId> = scopes.iter().map(RunScope::run).collect();
    assert_eq!(handed, [&fresh], "only the run within its budget");
    assert_eq!(store.inspect(&other).await.unwrap().state, RunState::Failed);
    for scope in scopes {
        scope.complete().await.unwrap();
    }
}
