//! A run's kind: claimed only by a claim of that kind, carried by every lease and record, fixed
//! for the run's life, and served by a Worker per kind without starving one by another.
//!
//! A backend without an index per kind refuses a run of any kind but the default with
//! [`InvalidInput::Unsupported`] and creates nothing: the scenarios check that refusal, and
//! stop there.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_core::{
    End, Error, InvalidInput, Kind, LeaseStore, LeaseStoreExt, ListFilter, NewRun, RunId, RunState,
    Ttl,
};
use lease_runtime::{Kinds, RunContext, Worker, WorkerConfig};
use tokio::time::Instant;

use crate::scenarios::{long, run, worker};
use crate::StoreFactory;

fn kind(name: &str) -> Kind {
    Kind::new(name).expect("a valid kind")
}

fn of(id: &str, k: &str) -> NewRun {
    NewRun::new(run(id)).with_kind(kind(k))
}

/// Whether the store offers kinds; if it refuses them, that the refusal is the typed one and
/// created nothing.
async fn offers_kinds(store: &dyn LeaseStore) -> bool {
    match store.create_with(&of("probe", "probe-kind")).await {
        Ok(record) => {
            assert_eq!(record.kind, kind("probe-kind"), "the create's record");
            true
        }
        Err(Error::InvalidInput(InvalidInput::Unsupported { .. })) => {
            assert!(
                matches!(
                    store.inspect(&run("probe")).await,
                    Err(Error::NotFound { .. })
                ),
                "a refused kind created its run"
            );
            assert!(matches!(
                store
                    .claim_next_kind(&kind("probe-kind"), &worker("w"), long(), 1)
                    .await,
                Err(Error::InvalidInput(InvalidInput::Unsupported { .. }))
            ));
            eprintln!("this backend has no kinds yet: refused, nothing created");
            false
        }
        Err(e) => panic!("create of a run with a kind: {e}"),
    }
}

/// Runs of a kind are claimed only by `claim_next_kind` of that kind (never by `claim_next`,
/// which is the default kind's, nor by another kind's), alone or created in a mixed batch;
/// every lease and record carries the kind (claim by id, renewal, inspect, list); a kind no
/// claim asks for waits; a released run goes back to its own kind; `list` filters by kind;
/// and a create of an existing id with another kind changes nothing.
pub async fn runs_are_claimed_only_by_a_claim_of_their_kind(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    if !offers_kinds(&*store).await {
        return;
    }
    for new in [
        of("e1", "email"),
        of("c1", "charge"),
        NewRun::new(run("d1")),
        of("e2", "email"),
    ] {
        store.create_with(&new).await.unwrap();
    }
    let batch = [of("e3", "email"), of("c2", "charge"), of("r1", "report")];
    let created = store.create_many_with(&batch).await.unwrap();
    assert!(created.iter().all(Result::is_ok), "{created:?}");

    // The default kind: only the run created without one.
    let default = store.claim_next(&worker("d"), long(), 100).await.unwrap();
    assert_eq!(
        default.iter().map(|l| l.run().as_str()).collect::<Vec<_>>(),
        ["d1"]
    );
    assert!(default[0].kind().is_default());

    let emails = store
        .claim_next_kind(&kind("email"), &worker("e"), long(), 100)
        .await
        .unwrap();
    assert_eq!(
        emails
            .iter()
            .map(|l| l.run().as_str())
            .collect::<BTreeSet<_>>(),
        BTreeSet::from(["e1", "e2", "e3"])
    );
    for lease in &emails {
        assert_eq!(lease.kind(), &kind("email"), "{lease:?}");
        let renewed = store.renew(lease).await.unwrap();
        assert_eq!(renewed.kind(), &kind("email"), "a renewal keeps the kind");
    }
    assert!(store
        .claim_next_kind(&kind("email"), &worker("e"), long(), 100)
        .await
        .unwrap()
        .is_empty());
    assert!(
        store
            .claim_next_kind(&kind("nobody-serves-this"), &worker("x"), long(), 100)
            .await
            .unwrap()
            .is_empty(),
        "a kind with no runs"
    );

    // Claim by id: the lease says the kind.
    let c1 = store.claim(&run("c1"), &worker("c"), long()).await.unwrap();
    assert_eq!(c1.kind(), &kind("charge"));
    let charges = store
        .claim_next_kind(&kind("charge"), &worker("c"), long(), 100)
        .await
        .unwrap();
    assert_eq!(
        charges.iter().map(|l| l.run().as_str()).collect::<Vec<_>>(),
        ["c2"]
    );

    // A released run goes back to its own kind only.
    let e1 = emails.iter().find(|l| l.run().as_str() == "e1").unwrap();
    store.release(e1).await.unwrap();
    assert!(store
        .claim_next(&worker("d"), long(), 100)
        .await
        .unwrap()
        .is_empty());
    assert!(store
        .claim_next_kind(&kind("charge"), &worker("c"), long(), 100)
        .await
        .unwrap()
        .is_empty());
    let again = store
        .claim_next_kind(&kind("email"), &worker("e"), long(), 100)
        .await
        .unwrap();
    assert_eq!(
        again.iter().map(|l| l.run().as_str()).collect::<Vec<_>>(),
        ["e1"]
    );
    assert_eq!(again[0].fence().get(), 2);

    // The report run was never claimed: it waits, runnable at fence 0.
    let r1 = store.inspect(&run("r1")).await.unwrap();
    assert_eq!(
        (r1.state, r1.fence.get(), r1.kind.clone()),
        (RunState::Runnable, 0, kind("report"))
    );

    // Records carry the kind; list filters on it.
    let listed = store
        .list(&ListFilter::new().with_kind(kind("charge")))
        .await
        .unwrap();
    assert_eq!(
        listed.iter().map(|r| r.run.as_str()).collect::<Vec<_>>(),
        ["c1", "c2"]
    );
    assert!(listed.iter().all(|r| r.kind == kind("charge")));
    let defaults = store
        .list(&ListFilter::new().with_kind(Kind::default()))
        .await
        .unwrap();
    assert_eq!(
        defaults.iter().map(|r| r.run.as_str()).collect::<Vec<_>>(),
        ["d1"]
    );
    let all = store.list(&ListFilter::new()).await.unwrap();
    let kinds: BTreeMap<&str, &str> = all
        .iter()
        .map(|r| (r.run.as_str(), r.kind.as_str()))
        .collect();
    assert_eq!(kinds["e2"], "email");
    assert_eq!(kinds["d1"], "default");
    assert_eq!(kinds["r1"], "report");

    // The kind is fixed: a create of an existing id with another kind is refused.
    assert!(matches!(
        store.create_with(&of("c1", "email")).await,
        Err(Error::AlreadyExists { .. })
    ));
    assert_eq!(
        store.inspect(&run("c1")).await.unwrap().kind,
        kind("charge")
    );
    let records = store.inspect_many(&[run("e3"), run("c2")]).await.unwrap();
    assert_eq!(records[0].as_ref().unwrap().kind, kind("email"));
    assert_eq!(records[1].as_ref().unwrap().kind, kind("charge"));

    // Counts take every kind: held d1, e1-e3, c1, c2; claimable r1 and the probe.
    match store.count().await {
        Err(Error::InvalidInput(InvalidInput::Unsupported { .. })) => {}
        Err(e) => panic!("count: {e}"),
        Ok(counts) => assert_eq!(
            (counts.held, counts.claimable, counts.delayed),
            (6, 2, 0),
            "{counts:?}"
        ),
    }
}

/// Calls by id (claim, resume, force-release, cancel), whose caller does not know the run's
/// kind, and ends under a lease that names another kind than its run's (a lease built or
/// changed by hand), all keep the run in its own kind: afterwards only a claim of that kind
/// takes it, and the default kind's claim never does.
pub async fn by_id_calls_and_mislabelled_leases_keep_a_run_in_its_kind(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    if !offers_kinds(&*store).await {
        return;
    }
    let alpha = kind("alpha");
    let ids = ["k1", "k2", "k3"];
    let batch: Vec<NewRun> = ids.iter().map(|id| of(id, "alpha")).collect();
    let created = store.create_many_with(&batch).await.unwrap();
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    let w = worker("w");
    // Only the probe is of another kind, and only k-runs are alpha: the default kind has none.
    let nothing_default = || async {
        assert!(
            store.claim_next(&w, long(), 100).await.unwrap().is_empty(),
            "the default kind's claim took an alpha run"
        );
    };
    let take_alpha = || async {
        let mut taken: Vec<String> = store
            .claim_next_kind(&alpha, &w, long(), 100)
            .await
            .unwrap()
            .iter()
            .map(|l| l.run().as_str().to_owned())
            .collect();
        taken.sort();
        taken
    };

    // Claimed by id, released under a lease that names the default kind.
    let k1 = store.claim(&run("k1"), &w, long()).await.unwrap();
    assert_eq!(k1.kind(), &alpha);
    store
        .release(&k1.clone().with_kind(Kind::default()))
        .await
        .unwrap();
    nothing_default().await;
    let k1 = store.claim(&run("k1"), &w, long()).await.unwrap();
    assert_eq!((k1.fence().get(), k1.kind()), (2, &alpha));

    // A batch of ends, each item's lease naming a wrong kind: released and suspended runs stay
    // alpha; a retry delay too.
    let k2 = store.claim(&run("k2"), &w, long()).await.unwrap();
    let k3 = store.claim(&run("k3"), &w, long()).await.unwrap();
    let ends = [
        lease_core::Ending::new(k1.clone().with_kind(kind("beta")), End::Release),
        lease_core::Ending::new(k2.clone().with_kind(Kind::default()), End::Suspend),
        lease_core::Ending::new(
            k3.clone().with_kind(kind("gamma")),
            End::RetryAfter(Duration::from_millis(1)),
        ),
    ];
    let answers = store.end_many(&ends).await.unwrap();
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    nothing_default().await;
    // k3 comes back once its delay is over (a backend may time it coarsely: etcd's leases).
    let mut taken = take_alpha().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !taken.contains(&"k3".to_owned()) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        nothing_default().await;
        taken.extend(take_alpha().await);
    }
    taken.sort();
    assert_eq!(taken, ["k1", "k3"]);

    // Resumed by id: back in alpha.
    assert_eq!(store.resume(&run("k2")).await.unwrap().kind, alpha);
    nothing_default().await;
    assert_eq!(take_alpha().await, ["k2"]);

    // Force-released by id: back in alpha, claimable at once.
    let released = store.force_release(&run("k1")).await.unwrap();
    assert_eq!(released.kind, alpha);
    nothing_default().await;
    assert_eq!(take_alpha().await, ["k1"]);

    // Cancelled by id while held: the holder is fenced out, and no claim of any kind takes it.
    store.create_with(&of("k4", "alpha")).await.unwrap();
    store.create_with(&of("k5", "alpha")).await.unwrap();
    let k4 = store.claim(&run("k4"), &w, long()).await.unwrap();
    let cancelled = store.cancel(&run("k4"), "not wanted").await.unwrap();
    assert_eq!(
        (cancelled.state, cancelled.kind),
        (RunState::Cancelled, alpha.clone())
    );
    let renewal = store.renew(&k4).await;
    assert!(
        matches!(
            renewal,
            Err(Error::LeaseEnded { ended: lease_core::Ended::Cancelled, fence, .. })
                if fence == k4.fence().get()
        ),
        "{renewal:?}"
    );
    nothing_default().await;
    assert_eq!(take_alpha().await, ["k5"]);
    assert!(take_alpha().await.is_empty());
}

/// One Worker serving two kinds runs each kind's runs with that kind's handler only, holds a
/// kind to its own concurrency limit, never claims a kind it does not serve (that run waits,
/// unclaimed), and takes the kinds in turn: a run of a kind with one run is handled while the
/// other kind still has most of a deep backlog waiting.
pub async fn a_worker_serves_each_kind_with_its_handler_and_starves_none(
    factory: &dyn StoreFactory,
) {
    let store = factory.fresh().await;
    if !offers_kinds(&*store).await {
        return;
    }
    const BULK: usize = 120;
    let mut batch: Vec<NewRun> = (0..BULK)
        .map(|i| of(&format!("bulk-{i:03}"), "bulk"))
        .collect();
    batch.push(of("urgent", "urgent"));
    batch.extend((0..3).map(|i| of(&format!("report-{i}"), "report")));
    store.create_many_with(&batch).await.unwrap();

    let seen: Arc<Mutex<Vec<(String, RunId, Kind)>>> = Arc::default();
    let bulk_done = Arc::new(AtomicUsize::new(0));
    let bulk_when_urgent = Arc::new(Mutex::new(None));
    let (running, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let bulk = {
        let (seen, done, running, most) = (
            seen.clone(),
            bulk_done.clone(),
            running.clone(),
            most.clone(),
        );
        move |ctx: RunContext| {
            let (seen, done, running, most) =
                (seen.clone(), done.clone(), running.clone(), most.clone());
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                seen.lock()
                    .unwrap()
                    .push(("bulk".into(), ctx.run().clone(), ctx.kind()));
                tokio::time::sleep(Duration::from_millis(5)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                done.fetch_add(1, Ordering::SeqCst);
                Ok(End::Complete)
            }
        }
    };
    let urgent = {
        let (seen, done, when) = (seen.clone(), bulk_done.clone(), bulk_when_urgent.clone());
        move |ctx: RunContext| {
            let (seen, done, when) = (seen.clone(), done.clone(), when.clone());
            async move {
                *when.lock().unwrap() = Some(done.load(Ordering::SeqCst));
                seen.lock()
                    .unwrap()
                    .push(("urgent".into(), ctx.run().clone(), ctx.kind()));
                Ok(End::Complete)
            }
        }
    };
    let config = WorkerConfig::new(Ttl::from_secs(30).unwrap())
        .with_concurrency(8)
        .with_poll_interval(Duration::from_millis(20));
    let w = Worker::new(store.clone(), worker("kinds"), config).unwrap();
    let shutdown = lease_runtime::CancellationToken::new();
    let kinds = Kinds::new()
        .handle_limited(kind("bulk"), bulk, 2)
        .handle(kind("urgent"), urgent);
    let stop = shutdown.clone();
    let handle = tokio::spawn(async move { w.run_kinds(kinds, stop).await });
    let give_up = Instant::now() + Duration::from_secs(60);
    while bulk_done.load(Ordering::SeqCst) < BULK || bulk_when_urgent.lock().unwrap().is_none() {
        assert!(
            Instant::now() < give_up,
            "the runs were not handled in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    let report = handle.await.unwrap().unwrap();
    assert_eq!(report.completed, BULK as u64 + 1, "{report:?}");

    let seen = seen.lock().unwrap().clone();
    for (handler, id, k) in seen.iter() {
        assert_eq!(
            handler,
            k.as_str(),
            "{id} of kind {k} ran in the {handler} handler"
        );
        let record = store.inspect(id).await.unwrap();
        assert_eq!(record.kind, *k);
        assert_eq!(record.state, RunState::Completed);
    }
    assert_eq!(seen.len(), BULK + 1, "each run handled once");
    assert!(
        most.load(Ordering::SeqCst) <= 2,
        "the bulk kind's limit is 2; {} ran at once",
        most.load(Ordering::SeqCst)
    );
    let before = bulk_when_urgent.lock().unwrap().unwrap();
    assert!(
        before < BULK / 2,
        "the urgent run waited for {before} of {BULK} bulk runs: starved"
    );
    for i in 0..3 {
        let record = store.inspect(&run(&format!("report-{i}"))).await.unwrap();
        assert_eq!(
            (record.state, record.fence.get()),
            (RunState::Runnable, 0),
            "no worker serves report"
        );
    }

    // Bad kind sets are refused before anything is claimed.
    let w = Worker::new(
        store.clone(),
        worker("bad"),
        WorkerConfig::new(long()).with_concurrency(4),
    )
    .unwrap();
    let noop = |_ctx: RunContext| async { Ok(End::Complete) };
    for (kinds, setting) in [
        (Kinds::new(), "kinds"),
        (
            Kinds::new()
                .handle(kind("report"), noop)
                .handle(kind("report"), noop),
            "kinds",
        ),
        (
            Kinds::new().handle_limited(kind("report"), noop, 5),
            "kind concurrency",
        ),
    ] {
        let refused = w
            .run_kinds(kinds, lease_runtime::CancellationToken::new())
            .await;
        assert!(
            matches!(
                &refused,
                Err(Error::InvalidInput(InvalidInput::WorkerSetting { setting: s, .. })) if *s == setting
            ),
            "{refused:?}"
        );
    }
    let record = store.inspect(&run("report-0")).await.unwrap();
    assert_eq!(record.fence.get(), 0, "a refused worker claimed");
    // The store's own verdicts are unchanged for a kind's lease.
    let lease = store
        .claim_next_kind(&kind("report"), &worker("r"), long(), 1)
        .await
        .unwrap()
        .remove(0);
    store.complete(&lease).await.unwrap();
    assert!(matches!(
        store.fail(&lease, "late").await,
        Err(Error::LeaseEnded { .. })
    ));
}
