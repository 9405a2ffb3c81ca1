//! The holes a review found where users meet the store: a purged id created again below its
//! last fence (alone, and racing a purger), and a failure reason that poisons a batch.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_core::{
    End, Ended, Ending, Error, InvalidInput, Lease, LeaseStoreExt, RunId, RunState, Ttl,
};
use lease_runtime::{CancellationToken, RetryPolicy, RunContext, Worker, WorkerConfig};
use tokio::time::Instant;

use crate::scenarios::{created, long, run, worker};
use crate::StoreFactory;

/// Every write a lease of a purged run's old life presents is refused after the id is created
/// again: `LeaseEnded` (released) while the new run waits, `StaleFence` once it is claimed;
/// the new run starts at the old run's last fence, through `create` and `create_many` alike,
/// over several lives.
pub async fn a_purged_id_created_again_refuses_every_lease_of_its_old_life(
    factory: &dyn StoreFactory,
) {
    let store = factory.fresh().await;
    let single = created(&*store, "reborn").await;
    let batched = created(&*store, "reborn-batch").await;
    let mut old: Vec<Lease> = Vec::new();
    for life in 0..3u64 {
        let mut leases = Vec::new();
        for id in [&single, &batched] {
            let lease = store.claim(id, &worker("a"), long()).await.unwrap();
            assert_eq!(lease.fence().get(), life + 1, "{id}, life {life}");
            store.complete(&lease).await.unwrap();
            leases.push(lease);
        }
        let mut purged = store.purge(Duration::ZERO, 10).await.unwrap();
        purged.sort();
        assert_eq!(purged, [single.clone(), batched.clone()], "life {life}");
        for id in [&single, &batched] {
            assert!(matches!(
                store.inspect(id).await,
                Err(Error::NotFound { .. })
            ));
        }
        let again = store.create(&single).await.unwrap();
        assert_eq!(
            (again.fence.get(), again.state, again.heartbeats),
            (life + 1, RunState::Runnable, 0),
            "created again at its last fence"
        );
        let results = store
            .create_many(std::slice::from_ref(&batched))
            .await
            .unwrap();
        assert!(results[0].is_ok(), "{results:?}");
        assert_eq!(store.inspect(&batched).await.unwrap().fence.get(), life + 1);
        // The lease of the life just ended: refused as released until the new life's claim.
        for lease in &leases {
            match store.append(lease, b"late").await {
                Err(Error::LeaseEnded {
                    fence,
                    ended: Ended::Released,
                    ..
                }) => assert_eq!(fence, life + 1),
                other => panic!("a purged life's lease wrote into the next: {other:?}"),
            }
        }
        old.extend(leases);
    }
    // The next claim continues above every fence either id ever issued, and every old lease
    // is now stale: renewals, appends and ends alike.
    for id in [&single, &batched] {
        let lease = store.claim(id, &worker("b"), long()).await.unwrap();
        assert_eq!(lease.fence().get(), 4, "{id}");
    }
    for lease in &old {
        let current = 4;
        let presented = lease.fence().get();
        let stale = |e: &Error| matches!(e, Error::StaleFence { presented: p, current: c, .. } if *p == presented && *c == current);
        let renewed = store.renew(lease).await.unwrap_err();
        assert!(stale(&renewed), "{renewed:?}");
        let appended = store.append(lease, b"late").await.unwrap_err();
        assert!(stale(&appended), "{appended:?}");
        let ended = store
            .end_many(&[Ending::new(lease.clone(), End::Complete)])
            .await
            .unwrap();
        assert!(matches!(&ended[0], Err(e) if stale(e)), "{:?}", ended[0]);
    }
    assert!(store.journal(&single).await.unwrap().is_empty());
}

/// A purger in a tight loop while four workers create, claim and complete six ids: no fence is
/// ever issued twice for one id, and no write is accepted under a lease whose completion was
/// acknowledged. Runs for a couple of seconds.
pub async fn purge_racing_creates_never_reissues_a_fence(factory: &dyn StoreFactory) {
    const IDS: usize = 6;
    const WORKERS: usize = 4;
    let window = Duration::from_secs(2);
    let store = factory.fresh().await;
    let ids: Arc<Vec<RunId>> = Arc::new((0..IDS).map(|i| run(&format!("race-{i}"))).collect());
    let stop = Arc::new(AtomicBool::new(false));
    // Every fence each id's claims returned, and the leases whose completion was acknowledged.
    let issued: Arc<Mutex<BTreeMap<RunId, HashSet<u64>>>> = Arc::default();
    let twice: Arc<Mutex<Vec<(RunId, u64)>>> = Arc::default();
    let ended: Arc<Mutex<Vec<Lease>>> = Arc::default();
    let accepted_late: Arc<Mutex<Vec<String>>> = Arc::default();
    let purged = Arc::new(AtomicU64::new(0));
    let recreated = Arc::new(AtomicU64::new(0));

    let purger = {
        let (store, stop, purged) = (store.clone(), stop.clone(), purged.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match store.purge(Duration::ZERO, 100).await {
                    Ok(gone) => {
                        purged.fetch_add(gone.len() as u64, Ordering::Relaxed);
                    }
                    Err(e) if e.is_retryable() => {}
                    Err(e) => panic!("purge failed: {e}"),
                }
                tokio::task::yield_now().await;
            }
        })
    };
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let (store, stop, ids) = (store.clone(), stop.clone(), ids.clone());
        let (issued, twice, ended) = (issued.clone(), twice.clone(), ended.clone());
        let (accepted_late, recreated) = (accepted_late.clone(), recreated.clone());
        workers.push(tokio::spawn(async move {
            let me = worker(&format!("racer-{w}"));
            let mut turn = w;
            while !stop.load(Ordering::Relaxed) {
                // An in-process store answers without ever suspending: let the clock run.
                tokio::task::yield_now().await;
                turn += 1;
                let id = &ids[turn % IDS];
                match store.create(id).await {
                    Ok(record) if record.fence.get() > 0 => {
                        recreated.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(_) | Err(Error::AlreadyExists { .. }) => {}
                    Err(e) if e.is_retryable() => continue,
                    Err(e) => panic!("create failed: {e}"),
                }
                let lease = match store.claim(id, &me, long()).await {
                    Ok(lease) => lease,
                    Err(e) if e.is_verdict() || e.is_retryable() => continue,
                    Err(e) => panic!("claim failed: {e}"),
                };
                if !issued
                    .lock()
                    .unwrap()
                    .entry(id.clone())
                    .or_default()
                    .insert(lease.fence().get())
                {
                    twice
                        .lock()
                        .unwrap()
                        .push((id.clone(), lease.fence().get()));
                }
                match store.complete(&lease).await {
                    Ok(()) => ended.lock().unwrap().push(lease.clone()),
                    Err(e) if e.is_retryable() => continue,
                    Err(e) => panic!("complete of a lease just claimed failed: {e}"),
                }
                // Any lease completed so far, this one included: its writes stay refused
                // through every purge and every new life of its id.
                let probe = {
                    let ended = ended.lock().unwrap();
                    ended[turn % ended.len()].clone()
                };
                match store.append(&probe, b"late").await {
                    Ok(_) => accepted_late.lock().unwrap().push(format!(
                        "{} at fence {}",
                        probe.run(),
                        probe.fence()
                    )),
                    Err(e) if e.is_verdict() || e.is_retryable() => {}
                    Err(e) => panic!("append failed: {e}"),
                }
            }
        }));
    }
    tokio::time::sleep(window).await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.expect("a racer panicked");
    }
    purger.await.expect("the purger panicked");

    let twice = twice.lock().unwrap().clone();
    assert!(
        twice.is_empty(),
        "{} fence(s) issued twice, the first: {:?}",
        twice.len(),
        &twice[..twice.len().min(5)]
    );
    let late = accepted_late.lock().unwrap().clone();
    assert!(
        late.is_empty(),
        "writes accepted under acknowledged-ended leases: {late:?}"
    );
    let claims: usize = issued.lock().unwrap().values().map(HashSet::len).sum();
    let (purged, recreated) = (
        purged.load(Ordering::Relaxed),
        recreated.load(Ordering::Relaxed),
    );
    // The race was run, not dodged: runs were purged and created again under load.
    assert!(
        purged > 0 && recreated > 0 && claims > IDS,
        "{claims} claims, {purged} purged, {recreated} created again"
    );
    eprintln!(
        "purge racing creates for {window:?}: {claims} claims, {purged} purged, {recreated} \
         created again, no fence issued twice"
    );
}

/// A failure reason with a control character other than a tab or a line feed (a NUL, an
/// escape sequence) is refused before any I/O with the offending byte, through `fail` and in a
/// batch, and the whole batch changes nothing; tabs and line feeds are kept verbatim.
pub async fn a_failure_reason_with_a_control_character_is_refused_before_any_io(
    factory: &dyn StoreFactory,
) {
    let store = factory.fresh().await;
    let (a, b) = (
        created(&*store, "nul").await,
        created(&*store, "neighbour").await,
    );
    let la = store.claim(&a, &worker("w"), long()).await.unwrap();
    let lb = store.claim(&b, &worker("w"), long()).await.unwrap();
    for (reason, at, code) in [
        ("card\0declined", 4, 0),
        ("\u{1b}[2Jwiped", 0, 0x1b),
        ("carriage\rreturn", 8, 0x0d),
        ("del\u{7f}", 3, 0x7f),
    ] {
        let err = store.fail(&la, reason).await.unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidInput(InvalidInput::ReasonControlCharacter { at: a, code: c })
                    if a == at && c == code
            ),
            "{reason:?}: {err:?}"
        );
        let batch = [
            Ending::new(lb.clone(), End::Complete),
            Ending::new(la.clone(), End::Fail(reason.to_owned())),
        ];
        let err = store.end_many(&batch).await.unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidInput(InvalidInput::ReasonControlCharacter { .. })
            ),
            "{err:?}"
        );
    }
    // Nothing changed: both leases are still held and renew.
    store
        .renew(&la)
        .await
        .expect("a refused fail changes nothing");
    store
        .renew(&lb)
        .await
        .expect("a refused batch changes nothing");
    let kept = "card declined:\n\tinsufficient funds";
    store.fail(&la, kept).await.unwrap();
    let record = store.inspect(&a).await.unwrap();
    assert_eq!(
        (record.state, record.failure.as_deref()),
        (RunState::Failed, Some(kept))
    );
}

/// A Worker whose handlers fail with messages holding NULs and escapes, beside fifty that
/// complete: every neighbour completes, and each poison run ends failed with its reason
/// escaped (a handler error at its last attempt, and a handler's own `End::Fail`).
pub async fn a_worker_escapes_control_characters_in_the_reasons_it_records(
    factory: &dyn StoreFactory,
) {
    let store = factory.fresh().await;
    let mut ids: Vec<RunId> = (0..50).map(|i| run(&format!("fine-{i:02}"))).collect();
    let (erring, failing) = (run("poison-error"), run("poison-fail"));
    ids.push(erring.clone());
    ids.push(failing.clone());
    let results = store.create_many(&ids).await.unwrap();
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let config = WorkerConfig::new(Ttl::from_secs(30).unwrap())
        .with_concurrency(64)
        .with_poll_interval(Duration::from_millis(10))
        .with_batch(100, Duration::from_millis(50))
        .with_retry(RetryPolicy::default().with_max_attempts(1));
    let w = Worker::new(store.clone(), worker("escaper"), config).unwrap();
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let handle = tokio::spawn(async move {
        w.run(
            |ctx: RunContext| async move {
                match ctx.run().as_str() {
                    "poison-error" => Err("bad\0reply \u{1b}[31m".into()),
                    "poison-fail" => Ok(End::Fail("no\0card".to_owned())),
                    _ => Ok(End::Complete),
                }
            },
            stop,
        )
        .await
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let records = loop {
        let records: Vec<_> = store
            .inspect_many(&ids)
            .await
            .unwrap()
            .into_iter()
            .map(Result::unwrap)
            .collect();
        if records
            .iter()
            .all(|r| matches!(r.state, RunState::Completed | RunState::Failed))
        {
            break records;
        }
        assert!(
            Instant::now() < deadline,
            "not every run ended: {:?}",
            records
                .iter()
                .filter(|r| r.state == RunState::Runnable)
                .map(|r| r.run.as_str())
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    shutdown.cancel();
    let report = handle.await.unwrap().unwrap();
    assert_eq!((report.completed, report.gave_up), (50, 2), "{report:?}");
    let reason = |id: &RunId| {
        let r = records.iter().find(|r| &r.run == id).unwrap();
        (r.state, r.failure.clone())
    };
    assert_eq!(
        reason(&erring),
        (RunState::Failed, Some("bad\\0reply \\u{1b}[31m".to_owned()))
    );
    assert_eq!(
        reason(&failing),
        (RunState::Failed, Some("no\\0card".to_owned()))
    );
}
