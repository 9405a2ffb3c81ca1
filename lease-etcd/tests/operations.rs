//! The operations etcd users run, on private three-member clusters: leader changes (which
//! re-arm every etcd lease to its full TTL), expiring auth tokens and user changes, and a
//! snapshot restore done as etcd's guide does it. One at a time (`--test-threads=1`): each
//! starts its own cluster and some kill or restore members.

use std::time::{Duration, Instant};

use lease_conformance::fixtures::etcd::{EtcdCluster, HINT, MEMBERS};
use lease_conformance::fixtures::required;
use lease_core::{Error, LeaseStore, RunId, Ttl, WorkerId};
use lease_etcd::{EtcdConfig, EtcdLeaseStore};

fn id(name: &str) -> RunId {
    RunId::new(name).unwrap()
}

fn endpoints(cluster: &EtcdCluster) -> Vec<String> {
    (0..MEMBERS).map(|i| cluster.endpoint(i)).collect()
}

/// 300 runs claimed with an 8 s TTL and abandoned, the leader moved at 6 s (re-arming their
/// etcd leases to a full TTL, so etcd holds them past the expiry their records show), a run
/// created at 9 s: the first `claim_next(10)` hands it out, and none of the 300. Before,
/// `claim_next` read 224 entries from the start of the index, all held, and answered `[]`
/// until etcd released them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_change_does_not_stall_claim_next() {
    let Some(mut cluster) = required(
        "etcd cluster",
        EtcdCluster::start().map_err(|e| e.to_string()),
        HINT,
    ) else {
        return;
    };
    let store = EtcdLeaseStore::connect(EtcdConfig::new(endpoints(&cluster), "hol").unwrap())
        .await
        .unwrap();
    let dead = WorkerId::new("dead").unwrap();
    let held: Vec<RunId> = (0..300).map(|i| id(&format!("held-{i:03}"))).collect();
    for r in store.create_many(&held).await.unwrap() {
        r.unwrap();
    }
    let started = Instant::now();
    let claimed = store
        .claim_next(&dead, Ttl::from_secs(8).unwrap(), 300)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 300);
    tokio::time::sleep(Duration::from_secs(6).saturating_sub(started.elapsed())).await;
    let leader = tokio::task::block_in_place(|| cluster.move_leader()).unwrap();
    tokio::time::sleep(Duration::from_secs(9).saturating_sub(started.elapsed())).await;
    let fresh = id("fresh");
    store.create(&fresh).await.unwrap();
    let got = store
        .claim_next(
            &WorkerId::new("live").unwrap(),
            Ttl::from_secs(30).unwrap(),
            10,
        )
        .await
        .unwrap();
    let runs: Vec<&RunId> = got.iter().map(|l| l.run()).collect();
    assert_eq!(
        runs,
        vec![&fresh],
        "at {:?}, after member {leader} took over: the new run at once, no held one",
        started.elapsed()
    );
}

/// Simple tokens that expire after 5 s idle (`--auth-token-ttl 5`): a claim after 6 s idle,
/// a call after the leader was SIGKILLed (the two others go on), and renewals while an operator adds
/// a user (every token issued before is then refused as "revision of auth store is old")
/// all succeed within twice the call timeout. Before, the adapter never refreshed its token:
/// after 5 s idle every call answered `Misconfigured` for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_tokens_and_user_changes_are_recovered_from() {
    let Some(mut cluster) = required(
        "etcd cluster",
        EtcdCluster::start_with_flags(&["--auth-token", "simple", "--auth-token-ttl", "5"])
            .map_err(|e| e.to_string()),
        HINT,
    ) else {
        return;
    };
    let ctl = |cluster: &mut EtcdCluster, args: &[&str]| {
        tokio::task::block_in_place(|| cluster.ctl(args)).unwrap()
    };
    ctl(&mut cluster, &["user", "add", "root:s3cret-pw"]);
    ctl(&mut cluster, &["auth", "enable"]);
    let timeout = Duration::from_secs(2);
    let config = EtcdConfig::new(endpoints(&cluster), "auth")
        .unwrap()
        .with_user("root", "s3cret-pw")
        .with_timeout(timeout);
    let store = EtcdLeaseStore::connect(config).await.unwrap();
    let w = WorkerId::new("w").unwrap();
    let ttl = Ttl::from_secs(30).unwrap();
    let (a, b) = (id("a"), id("b"));
    store.create(&a).await.unwrap();
    store.create(&b).await.unwrap();

    // Within twice the timeout, a call succeeds (a failed one must be retryable).
    async fn recovers<T>(
        timeout: Duration,
        mut call: impl AsyncFnMut() -> lease_core::Result<T>,
    ) -> T {
        let started = Instant::now();
        loop {
            match call().await {
                Ok(t) => return t,
                Err(e) => {
                    assert!(e.is_retryable(), "a call answered {e:?}, not retryable");
                    assert!(
                        started.elapsed() < timeout * 2,
                        "still failing after {:?}: {e}",
                        started.elapsed()
                    );
                }
            }
        }
    }

    tokio::time::sleep(Duration::from_secs(6)).await;
    let lease = recovers(timeout, async || store.claim(&a, &w, ttl).await).await;
    assert_eq!(lease.fence().get(), 1);

    tokio::time::sleep(Duration::from_secs(6)).await;
    let victim = tokio::task::block_in_place(|| cluster.leader(Duration::from_secs(5))).unwrap();
    cluster.kill(victim);
    let lease = recovers(timeout, async || store.renew(&lease).await).await;

    // An operator adds a user while the holder renews and another run is claimed.
    let mut lease = lease;
    let mut errors = Vec::new();
    let until = Instant::now() + Duration::from_secs(3);
    let mut added = false;
    while Instant::now() < until {
        if !added && until - Instant::now() < Duration::from_secs(2) {
            ctl(
                &mut cluster,
                &["--user=root:s3cret-pw", "user", "add", "ops:other-pw"],
            );
            added = true;
        }
        match store.renew(&lease).await {
            Ok(renewed) => lease = renewed,
            Err(e) => errors.push(e),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(added);
    assert!(
        errors.is_empty(),
        "renewals around a user change answered {errors:?} (a refused token is refreshed and \
         the request sent again)"
    );
    let other = recovers(timeout, async || store.claim(&b, &w, ttl).await).await;
    assert_eq!(other.fence().get(), 1);
    // The password never shows.
    assert!(!format!("{store:?} {store}").contains("s3cret-pw"));
}

/// A snapshot, then a claim (fence 1) and an entry, then every member restored from the
/// snapshot with the guide's command (same `--initial-cluster-token`, so the same cluster
/// id): a process that connects afterwards is refused (the Raft log went back below the
/// index the prefix recorded), and the old process's append under fence 1 is refused too
/// (the revision it had seen went back). Before, the new process bound silently and would
/// have handed out fence 1 a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_cluster_cannot_reissue_a_fence() {
    let Some(mut cluster) = required(
        "etcd cluster",
        EtcdCluster::start().map_err(|e| e.to_string()),
        HINT,
    ) else {
        return;
    };
    let config = EtcdConfig::new(endpoints(&cluster), "restore").unwrap();
    // Some history first, as any cluster in use has.
    let setup = EtcdLeaseStore::connect(config.clone()).await.unwrap();
    let runs: Vec<RunId> = (0..100).map(|i| id(&format!("order-{i}"))).collect();
    for r in setup.create_many(&runs).await.unwrap() {
        r.unwrap();
    }
    for run in &runs[..50] {
        setup.inspect(run).await.unwrap();
        setup.force_release(run).await.unwrap();
    }
    let old = EtcdLeaseStore::connect(config.clone()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("snapshot.db");
    tokio::task::block_in_place(|| cluster.snapshot(&snapshot)).unwrap();

    let run = &runs[99];
    let lease = old
        .claim(
            run,
            &WorkerId::new("old").unwrap(),
            Ttl::from_secs(60).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(lease.fence().get(), 1);
    old.append(&lease, b"charged").await.unwrap();

    tokio::task::block_in_place(|| cluster.restore(&snapshot)).unwrap();

    let fresh = EtcdLeaseStore::connect(config.clone()).await;
    match &fresh {
        Err(e @ Error::Misconfigured { .. }) => {
            let text = e.to_string();
            assert!(text.contains("restored"), "{text}");
            assert!(text.contains("etcd-rebind"), "{text}");
        }
        other => panic!("a process connecting after the restore got {other:?}"),
    }
    let started = Instant::now();
    let late = loop {
        match old.append(&lease, b"charged again").await {
            Err(e) if e.is_retryable() && started.elapsed() < Duration::from_secs(10) => {}
            other => break other,
        }
    };
    assert!(
        matches!(&late, Err(Error::Misconfigured { .. })),
        "the old process's append under fence 1 answered {late:?}"
    );

    // The operator's way back: rebind, which raises every fence past anything the old history
    // could have issued, after which the prefix serves again.
    let rebound = EtcdLeaseStore::rebind(config.clone()).await.unwrap();
    assert!(rebound.before.is_some());
    let store = EtcdLeaseStore::connect(config).await.unwrap();
    let step = lease_core::REBIND_FENCE_STEP;
    assert_eq!(
        store.inspect(run).await.unwrap().fence.get(),
        step,
        "0 at the snapshot, raised by the rebind"
    );
    let again = store
        .claim(
            run,
            &WorkerId::new("new").unwrap(),
            Ttl::from_secs(60).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(again.fence().get(), step + 1, "never fence 1 a second time");
    let stale = store.append(&lease, b"charged by the old holder").await;
    assert!(
        matches!(&stale, Err(Error::StaleFence { .. })),
        "the old history's fence-1 lease answered {stale:?}"
    );
    // The floor rose too: a run created from now on starts above every old fence.
    let fresh = id("after-rebind");
    store.create(&fresh).await.unwrap();
    let first = store
        .claim(
            &fresh,
            &WorkerId::new("new").unwrap(),
            Ttl::from_secs(60).unwrap(),
        )
        .await
        .unwrap();
    assert!(first.fence().get() > step, "{}", first.fence());
}

/// A TTL and a `RetryAfter` delay longer than the store's `max_lease` (2 s here) are timed by
/// etcd in links of at most that: with the leader moved every 6 s (each move re-arms every
/// etcd lease to its full length), an abandoned 8 s hold and an 8 s delay both end while the
/// moves go on. Timed whole, each would be re-armed to 9 s at every move and never end while
/// moves come more often than that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_changes_delay_a_long_hold_by_at_most_a_link() {
    use lease_core::{End, Ending};
    let Some(mut cluster) = required(
        "etcd cluster",
        EtcdCluster::start().map_err(|e| e.to_string()),
        HINT,
    ) else {
        return;
    };
    let config = EtcdConfig::new(endpoints(&cluster), "links")
        .unwrap()
        .with_max_lease(Duration::from_secs(2));
    let store = EtcdLeaseStore::connect(config).await.unwrap();
    let (held, delayed) = (id("held"), id("delayed"));
    store.create(&held).await.unwrap();
    store.create(&delayed).await.unwrap();
    let dead = WorkerId::new("dead").unwrap();
    let ttl = Ttl::from_secs(8).unwrap();
    let started = Instant::now();
    store.claim(&held, &dead, ttl).await.unwrap();
    let lease = store.claim(&delayed, &dead, ttl).await.unwrap();
    let ended = store
        .end_many(&[Ending::new(lease, End::RetryAfter(Duration::from_secs(8)))])
        .await
        .unwrap();
    ended[0].as_ref().unwrap();

    let moves_for = Duration::from_secs(30);
    let mover = std::thread::spawn(move || {
        let mut moves = Vec::new();
        while started.elapsed() + Duration::from_secs(6) < moves_for {
            std::thread::sleep(Duration::from_secs(6));
            moves.push((started.elapsed(), cluster.move_leader().unwrap()));
        }
        (cluster, moves)
    });
    let live = WorkerId::new("live").unwrap();
    let mut claimed = Vec::new();
    // A write cut by a move may answer `Unavailable` (a retryable error, as a Worker treats
    // it); a read cut by one is sent again inside the store and must not surface.
    let mut unavailable = Vec::new();
    while claimed.len() < 2 && started.elapsed() < moves_for {
        match store.claim_next(&live, ttl, 2).await {
            Ok(leases) => {
                for lease in leases {
                    claimed.push((lease.run().clone(), started.elapsed()));
                }
            }
            Err(e @ Error::Unavailable { .. }) => {
                assert!(
                    !e.to_string().contains("leader changed"),
                    "a read cut by a leader change reached the caller: {e}"
                );
                unavailable.push((started.elapsed(), e.to_string()));
            }
            Err(e) => panic!("claim_next while the leader moves: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (_cluster, moves) = tokio::task::block_in_place(|| mover.join().unwrap());
    assert!(moves.len() >= 3, "the leader moved every 6 s: {moves:?}");
    let runs: std::collections::HashSet<&RunId> = claimed.iter().map(|(r, _)| r).collect();
    assert_eq!(
        runs,
        [&held, &delayed].into_iter().collect(),
        "both claimable while the leader kept moving ({moves:?}); claimed {claimed:?}; \
         retryable refusals {unavailable:?}"
    );
    for (run, at) in &claimed {
        assert!(
            *at >= Duration::from_secs(8),
            "{run} claimed at {at:?}, before its 8 s"
        );
    }
}

/// 2,000 scopes renewing a 3 s lease each on their own (2,000 renewals a second, each a
/// separate call) while a dead holder's 5 s lease runs out: the store grants about one etcd
/// lease a second for all of them (they share a bucket), so etcd's revocation queue stays
/// short and the dead holder's run is claimable within the declared lag. Before, each renewal
/// granted its own lease: 2,000 grants a second, above etcd's 1,000 revocations a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_scopes_grant_a_lease_a_second_and_expiry_stays_prompt() {
    let Some(cluster) = required(
        "etcd cluster",
        EtcdCluster::start().map_err(|e| e.to_string()),
        HINT,
    ) else {
        return;
    };
    let store = std::sync::Arc::new(
        EtcdLeaseStore::connect(EtcdConfig::new(endpoints(&cluster), "storm").unwrap())
            .await
            .unwrap(),
    );
    let runs: Vec<RunId> = (0..2_000).map(|i| id(&format!("scope-{i:04}"))).collect();
    for chunk in runs.chunks(1_000) {
        for r in store.create_many(chunk).await.unwrap() {
            r.unwrap();
        }
    }
    let w = WorkerId::new("w").unwrap();
    let three = Ttl::from_secs(3).unwrap();
    let mut leases = Vec::new();
    for chunk in runs.chunks(1_000) {
        leases.extend(store.claim_next(&w, three, chunk.len()).await.unwrap());
    }
    assert_eq!(leases.len(), 2_000);
    let dead_run = id("dead-holder");
    store.create(&dead_run).await.unwrap();
    let before = store.leases_granted();
    let started = Instant::now();
    store
        .claim(
            &dead_run,
            &WorkerId::new("dead").unwrap(),
            Ttl::from_secs(5).unwrap(),
        )
        .await
        .unwrap();

    // Each scope renews its own lease every second, as a RunScope's heartbeat does.
    let stop = Instant::now() + Duration::from_secs(8);
    let renewers: Vec<_> = leases
        .into_iter()
        .map(|lease| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut lease = lease;
                let mut failed = 0u32;
                while Instant::now() < stop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    match store.renew(&lease).await {
                        Ok(renewed) => lease = renewed,
                        Err(_) => failed += 1,
                    }
                }
                failed
            })
        })
        .collect();
    // The claimer has its own connection and runtime: what it measures is etcd's expiry,
    // not its place in a queue behind 2,000 renewals on a shared client.
    let claimer_config = EtcdConfig::new(endpoints(&cluster), "storm").unwrap();
    let probe = dead_run.clone();
    let claimed_at = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let store = EtcdLeaseStore::connect(claimer_config).await.unwrap();
            let claimer = WorkerId::new("claimer").unwrap();
            loop {
                let sent = started.elapsed();
                match store
                    .claim(&probe, &claimer, Ttl::from_secs(3).unwrap())
                    .await
                {
                    Ok(_) => return (sent, started.elapsed()),
                    Err(Error::Held { .. }) => {}
                    Err(e) if e.is_retryable() => {}
                    Err(e) => panic!("claiming the dead holder's run: {e:?}"),
                }
                assert!(
                    started.elapsed() < Duration::from_secs(20),
                    "never claimable"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    });
    let (claim_sent, claimed_at) = tokio::task::block_in_place(|| claimed_at.join().unwrap());
    let mut failed = 0;
    for r in renewers {
        failed += r.await.unwrap();
    }
    let granted = store.leases_granted() - before;
    let elapsed = started.elapsed();
    eprintln!(
        "lease storm: 2,000 scopes renewing every second for {elapsed:?}: {granted} etcd leases \
         granted, {failed} renewals failed; the dead holder's 5 s lease claimed by a claim sent \
         at {claim_sent:?}, answered at {claimed_at:?}"
    );
    assert!(
        claimed_at >= Duration::from_secs(5),
        "claimed after {claimed_at:?}, before its TTL"
    );
    let claimed_at = claim_sent;
    assert!(
        claimed_at
            <= Duration::from_secs(5)
                + store.capabilities().max_expiry_lag
                + Duration::from_millis(500),
        "the dead holder's run was claimable only after {claimed_at:?}"
    );
    // One lease per duration per second: the 3 s bucket, the 5 s one, and rounding.
    let bound = elapsed.as_secs() * 2 + 4;
    assert!(
        granted <= bound,
        "{granted} grants in {elapsed:?} (at most {bound})"
    );
}

/// One URL that names members of two clusters is refused at connect, naming both endpoints:
/// calls failing over between them would mix two clusters' fences.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_naming_two_clusters_is_refused() {
    let start = || {
        required(
            "etcd cluster",
            EtcdCluster::start().map_err(|e| e.to_string()),
            HINT,
        )
    };
    let (Some(a), Some(b)) = (start(), start()) else {
        return;
    };
    let mixed = vec![a.endpoint(0), b.endpoint(0)];
    let refused = EtcdLeaseStore::connect(EtcdConfig::new(mixed.clone(), "mixed").unwrap()).await;
    match refused {
        Err(e @ Error::Misconfigured { .. }) => {
            let text = e.to_string();
            assert!(text.contains("two etcd clusters"), "{text}");
            assert!(
                text.contains(&mixed[0]) && text.contains(&mixed[1]),
                "{text}"
            );
        }
        other => panic!("a URL over two clusters connected: {other:?}"),
    }
}

/// Four tasks reading (`inspect` and `count`) in a tight loop
/// while the leader moves five times: none of them sees an error. A linearizable read cut by
/// a move ("etcdserver: leader changed", answered before anything is read) is sent again
/// inside the store; before, it reached the caller as `Unavailable`, and a test that claimed
/// through moves failed on it once in CI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_cut_by_a_leader_change_are_sent_again() {
    let Some(mut cluster) = required(
        "etcd cluster",
        EtcdCluster::start().map_err(|e| e.to_string()),
        HINT,
    ) else {
        return;
    };
    let store = std::sync::Arc::new(
        EtcdLeaseStore::connect(EtcdConfig::new(endpoints(&cluster), "reads").unwrap())
            .await
            .unwrap(),
    );
    let run = id("read-me");
    store.create(&run).await.unwrap();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut readers = Vec::new();
    for task in 0..4 {
        let (store, done, run) = (store.clone(), done.clone(), run.clone());
        readers.push(tokio::spawn(async move {
            let (mut reads, mut errors) = (0u64, Vec::new());
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let answer = match task % 2 {
                    0 => store.inspect(&run).await.map(drop),
                    _ => store.count().await.map(drop),
                };
                reads += 1;
                if let Err(e) = answer {
                    errors.push(e.to_string());
                }
            }
            (reads, errors)
        }));
    }
    let mut moves = Vec::new();
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        moves.push(tokio::task::block_in_place(|| cluster.move_leader()).unwrap());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut total = 0;
    for reader in readers {
        let (reads, errors) = reader.await.unwrap();
        total += reads;
        assert!(
            errors.is_empty(),
            "{} of {reads} reads failed while the leader moved to {moves:?}: {errors:?}",
            errors.len()
        );
    }
    assert!(
        total > 100,
        "the readers kept reading through the moves: {total}"
    );
}

/// Retention deletes: 300 runs with payloads, journals, idempotency keys, kinds, a failure and
/// a cancel, and one with a trace parent, all purged, leave at most 30 keys under the prefix
/// (the fence floor, the store's binding, the kinds' wake keys), none of them a run's, and no
/// trace parent; the purged id created again is claimed above its last fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purged_runs_leave_no_keys_behind() {
    let Some(mut cluster) = required(
        "etcd cluster",
        EtcdCluster::start().map_err(|e| e.to_string()),
        HINT,
    ) else {
        return;
    };
    let config = EtcdConfig::new(endpoints(&cluster), "retention").unwrap();
    let store = EtcdLeaseStore::connect(config.clone()).await.unwrap();
    let churned = lease_conformance::churn_and_purge(&store, 300).await;
    // A run with a trace parent: kept in its record, so it goes with the record.
    let parent =
        lease_core::TraceParent::new("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
            .unwrap();
    let traced = lease_core::NewRun::new(id("traced")).with_trace_parent(parent.clone());
    store.create_with(&traced).await.unwrap();
    let everything = |cluster: &mut EtcdCluster| {
        tokio::task::block_in_place(|| cluster.ctl(&["get", "--prefix", config.prefix()])).unwrap()
    };
    assert!(
        everything(&mut cluster).contains(parent.as_str()),
        "the trace parent is stored"
    );
    let lease = store
        .claim(
            &id("traced"),
            &WorkerId::new("w").unwrap(),
            Ttl::from_secs(30).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(lease.trace_parent(), Some(&parent));
    store.complete(&lease).await.unwrap();
    assert_eq!(
        store.purge_ids(&[id("traced")]).await.unwrap(),
        [id("traced")]
    );
    assert!(
        !everything(&mut cluster).contains(parent.as_str()),
        "the trace parent is purged with its run"
    );
    let keys = tokio::task::block_in_place(|| {
        cluster.ctl(&["get", "--prefix", config.prefix(), "--keys-only"])
    })
    .unwrap();
    let keys: Vec<&str> = keys.lines().filter(|l| !l.is_empty()).collect();
    eprintln!(
        "keys left after 300 runs were purged: {} {keys:?}",
        keys.len()
    );
    assert!(keys.len() <= 30, "{} keys left: {keys:?}", keys.len());
    lease_conformance::a_churned_id_comes_back_above_its_fence(&store, &churned).await;
}
