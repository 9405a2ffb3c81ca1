//! Faults on a private three-member etcd cluster: a worker cut off from every member by
//! iptables, and the leader SIGKILLed under load. Run one at a time (`--test-threads=1`):
//! they cut links and kill members. Need root and iptables (`bash scripts/test.sh`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lease_conformance::fixtures::etcd::{EtcdCluster, MEMBERS};
use lease_conformance::fixtures::{required, LinkCut, LINK_CUT_HINT};
use lease_core::{End, Ended, Ending, Error, LeaseStore, RunId, RunState, Ttl, WorkerId};
use lease_etcd::{EtcdConfig, EtcdLeaseStore};

fn cluster() -> Option<EtcdCluster> {
    required(
        "etcd cluster",
        EtcdCluster::start().map_err(|e| e.to_string()),
        lease_conformance::fixtures::etcd::HINT,
    )
}

/// A store on a cluster that just started. Connecting is retried while it is unavailable, up
/// to 10 s, as a worker's start-up would: every answer is printed.
async fn store(endpoints: Vec<String>, prefix: &str, timeout: Duration) -> EtcdLeaseStore {
    let config = EtcdConfig::new(endpoints, prefix)
        .expect("endpoints")
        .with_timeout(timeout);
    let started = Instant::now();
    loop {
        match EtcdLeaseStore::connect(config.clone()).await {
            Ok(store) => return store,
            Err(e @ Error::Unavailable { .. }) if started.elapsed() < Duration::from_secs(10) => {
                eprintln!("connect: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("connect: {e:?}"),
        }
    }
}

fn id(name: &str) -> RunId {
    RunId::new(name).unwrap()
}

/// The seed's partition scenario on etcd: A is cut off from all three members, its renewal
/// fails within its client-side bound, B reclaims at fence 2 once etcd expired A's lease, and
/// A's late writes after the cut heals are refused by the fence. The journal, the effect
/// ledger here, holds B's effect once and nothing A wrote after the cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cut_off_from_every_member_is_refused_by_the_fence() {
    let Some(cluster) = cluster() else { return };
    let via = |address: &str| -> Vec<String> {
        (0..MEMBERS)
            .map(|i| cluster.endpoint_via(i, address))
            .collect()
    };
    let bound = Duration::from_secs(1);
    let a = store(via("127.0.0.2"), "partition", bound).await;
    let b = store(via("127.0.0.1"), "partition", bound).await;
    let run = id("charge-order-7");
    a.create(&run).await.unwrap();
    let ttl = Ttl::from_secs(2).unwrap();
    let claimed_at = Instant::now();
    let lease_a = a
        .claim(&run, &WorkerId::new("a").unwrap(), ttl)
        .await
        .unwrap();
    assert_eq!(lease_a.fence().get(), 1);
    a.append(&lease_a, b"a: started").await.unwrap();

    let mut cuts = Vec::new();
    for i in 0..MEMBERS {
        let cut = LinkCut::cut_to("127.0.0.2", cluster.client_port(i));
        let Some(cut) = required("iptables", cut, LINK_CUT_HINT) else {
            return;
        };
        cuts.push(cut);
    }
    // A's heartbeat cannot reach any member: it fails within its bound, retryably.
    let sent = Instant::now();
    let renewal = a.renew(&lease_a).await;
    assert!(
        matches!(&renewal, Err(e @ Error::Unavailable { .. }) if e.is_retryable()),
        "a cut-off renewal answered {renewal:?}"
    );
    assert!(
        sent.elapsed() < bound * 3,
        "the renewal took {:?}, past its bound of {bound:?}",
        sent.elapsed()
    );

    // B reclaims once etcd's leader expired A's lease, never before the TTL.
    let w_b = WorkerId::new("b").unwrap();
    let lease_b = loop {
        match b.claim(&run, &w_b, Ttl::from_secs(30).unwrap()).await {
            Ok(lease) => break lease,
            Err(Error::Held { owner, .. }) => {
                assert_eq!(owner.as_str(), "a");
                assert!(
                    claimed_at.elapsed() < Duration::from_secs(10),
                    "never expired"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(other) => panic!("B's claim answered {other:?}"),
        }
    };
    assert!(
        claimed_at.elapsed() >= ttl.as_duration(),
        "B claimed {:?} after A's claim, inside A's TTL",
        claimed_at.elapsed()
    );
    assert_eq!(lease_b.fence().get(), 2);
    b.append(&lease_b, b"effect: card charged").await.unwrap();
    b.complete(&lease_b).await.unwrap();

    for mut cut in cuts {
        cut.heal();
    }
    // A comes back and writes under fence 1: refused by the fence, not by a clock. Its
    // connections may still be coming back (a reconnect waits out TCP's SYN backoff): an
    // unavailable answer is retryable and applies nothing, so A retries as a worker would.
    let healed = Instant::now();
    let late = loop {
        match a.append(&lease_a, b"effect: card charged").await {
            Err(Error::Unavailable { .. }) if healed.elapsed() < Duration::from_secs(15) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            answer => break answer,
        }
    };
    assert!(
        matches!(
            late,
            Err(Error::StaleFence {
                presented: 1,
                current: 2,
                ..
            })
        ),
        "A's late write answered {late:?}"
    );
    assert!(matches!(
        a.complete(&lease_a).await,
        Err(Error::StaleFence {
            presented: 1,
            current: 2,
            ..
        })
    ));
    let journal = b.journal(&run).await.unwrap();
    let written: Vec<(u64, &[u8])> = journal
        .iter()
        .map(|e| (e.fence.get(), e.payload.as_slice()))
        .collect();
    assert_eq!(
        written,
        vec![(1, &b"a: started"[..]), (2, &b"effect: card charged"[..])],
        "one effect, under fence 2"
    );
    assert_eq!(b.inspect(&run).await.unwrap().state, RunState::Completed);
}

/// What the workers saw, shared.
#[derive(Default)]
struct Ledger {
    /// Every fence each claim handed out, per run.
    issued: HashMap<RunId, Vec<u64>>,
    /// Runs whose completion was acknowledged (directly, or by a retry that found it applied).
    acked: HashSet<RunId>,
    /// Per worker: acknowledged completions after the leader was restarted.
    after_restart: HashMap<String, usize>,
    /// Errors by message class.
    errors: Vec<String>,
}

/// Leader loss under load: eight workers claim and complete runs in batches while the leader is
/// SIGKILLed and later restarted; one of them abandons every other batch under 2 s leases, so
/// the others reclaim those runs at higher fences, across the kill. No fence is issued twice
/// for a run, every acknowledged completion is there at the end, and every worker completes
/// runs again after the restart without being restarted itself. Every error was retryable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_workers_ride_through_the_leaders_death_and_restart() {
    let Some(mut cluster) = cluster() else { return };
    let endpoints: Vec<String> = (0..MEMBERS).map(|i| cluster.endpoint(i)).collect();
    let loader = store(endpoints.clone(), "leader", Duration::from_secs(2)).await;

    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let restarted: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let stop = Instant::now() + Duration::from_secs(16);
    let mut workers = Vec::new();
    for w in 0..8 {
        let store = store(endpoints.clone(), "leader", Duration::from_secs(2)).await;
        let ledger = ledger.clone();
        let restarted = restarted.clone();
        workers.push(tokio::spawn(async move {
            let worker = WorkerId::new(format!("w{w}")).unwrap();
            // w0 plays a worker that keeps dying: 2 s leases, and every other batch it claims
            // is abandoned, so others reclaim those runs at higher fences, across the kill.
            let dies = w == 0;
            let ttl = Ttl::from_secs(if dies { 2 } else { 10 }).unwrap();
            let mut batches = 0u64;
            let mut made = 0;
            while Instant::now() < stop {
                // Each worker brings its own work: ten runs per round, created (a retry that
                // finds one created already is fine), then claimed by whoever is first.
                let batch: Vec<RunId> = (made..made + 10)
                    .map(|i| id(&format!("{worker}-{i:06}")))
                    .collect();
                match store.create_many(&batch).await {
                    Ok(results) => {
                        for r in results {
                            assert!(
                                matches!(r, Ok(()) | Err(Error::AlreadyExists { .. })),
                                "{r:?}"
                            );
                        }
                        made += 10;
                    }
                    Err(e) => {
                        assert!(e.is_retryable(), "create_many: {e}");
                        ledger
                            .lock()
                            .unwrap()
                            .errors
                            .push(format!("create_many: {e}"));
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                }
                let leases = match store.claim_next(&worker, ttl, 10).await {
                    Ok(leases) => leases,
                    Err(e) => {
                        assert!(e.is_retryable(), "claim_next: {e}");
                        ledger
                            .lock()
                            .unwrap()
                            .errors
                            .push(format!("claim_next: {e}"));
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                {
                    let mut l = ledger.lock().unwrap();
                    for lease in &leases {
                        l.issued
                            .entry(lease.run().clone())
                            .or_default()
                            .push(lease.fence().get());
                    }
                }
                batches += 1;
                if dies && batches % 2 == 0 {
                    continue;
                }
                let ends: Vec<Ending> = leases
                    .iter()
                    .map(|l| Ending::new(l.clone(), End::Complete))
                    .collect();
                // Retry an unanswered batch until each item answers: a retry that finds its
                // end applied (LeaseEnded, same fence, Completed) is the first attempt's.
                let mut pending = ends;
                while !pending.is_empty() {
                    match store.end_many(&pending).await {
                        Ok(results) => {
                            let mut l = ledger.lock().unwrap();
                            let after = restarted.lock().unwrap().is_some();
                            let mut again = Vec::new();
                            for (ending, result) in pending.iter().zip(results) {
                                match result {
                                    Ok(())
                                    | Err(Error::LeaseEnded {
                                        ended: Ended::Completed,
                                        ..
                                    }) => {
                                        l.acked.insert(ending.lease.run().clone());
                                        if after {
                                            *l.after_restart
                                                .entry(worker.to_string())
                                                .or_default() += 1;
                                        }
                                    }
                                    Err(e) if e.is_retryable() => again.push(ending.clone()),
                                    // Reclaimed after its lease expired (only w0's 2 s leases
                                    // can): refused by the fence, not acknowledged.
                                    Err(Error::StaleFence { .. }) if dies => {}
                                    Err(e) => panic!("end of {}: {e}", ending.lease.run()),
                                }
                            }
                            pending = again;
                        }
                        Err(e) => {
                            assert!(e.is_retryable(), "end_many: {e}");
                            ledger.lock().unwrap().errors.push(format!("end_many: {e}"));
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
            }
        }));
    }

    tokio::time::sleep(Duration::from_secs(3)).await;
    let (killed, cluster) = tokio::task::spawn_blocking(move || {
        let leader = cluster.leader(Duration::from_secs(10)).expect("a leader");
        cluster.kill(leader);
        (leader, cluster)
    })
    .await
    .unwrap();
    let killed_at = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut cluster = tokio::task::spawn_blocking(move || {
        let mut cluster = cluster;
        cluster.restart(killed).expect("the killed leader restarts");
        cluster
    })
    .await
    .unwrap();
    *restarted.lock().unwrap() = Some(Instant::now());
    for worker in workers {
        worker.await.unwrap();
    }
    let new_leader = tokio::task::spawn_blocking(move || {
        let leader = cluster.leader(Duration::from_secs(10)).expect("a leader");
        (leader, cluster)
    })
    .await
    .unwrap();

    let ledger = std::mem::take(&mut *ledger.lock().unwrap());
    let twice: Vec<_> = ledger
        .issued
        .iter()
        .filter(|(_, fences)| {
            let distinct: HashSet<_> = fences.iter().collect();
            distinct.len() != fences.len()
        })
        .collect();
    assert!(
        twice.is_empty(),
        "fences issued twice on {} runs, first: {:?}",
        twice.len(),
        twice.iter().take(5).collect::<Vec<_>>()
    );
    let max_fence = ledger.issued.values().flatten().max().copied().unwrap_or(0);
    let reclaimed = ledger.issued.values().filter(|f| f.len() > 1).count();
    assert!(
        reclaimed > 0 && max_fence >= 2,
        "no run abandoned by w0 was reclaimed: the test did not exercise reclaims"
    );
    let acked: Vec<RunId> = ledger.acked.iter().cloned().collect();
    for chunk in acked.chunks(1_000) {
        for (run, record) in chunk.iter().zip(loader.inspect_many(chunk).await.unwrap()) {
            let record = record.unwrap();
            assert_eq!(
                record.state,
                RunState::Completed,
                "{run}: acknowledged, then lost"
            );
        }
    }
    for w in 0..8 {
        assert!(
            ledger
                .after_restart
                .get(&format!("w{w}"))
                .copied()
                .unwrap_or(0)
                > 0,
            "worker w{w} completed nothing after the restart: {:?}",
            ledger.after_restart
        );
    }
    eprintln!(
        "leader loss: killed member {killed} ({:?} before the end), new leader {}; {} claims over \
         {} runs, highest fence {max_fence}, {reclaimed} runs claimed again after their lease \
         expired, 0 fences issued twice; {} completions acknowledged, all found completed; \
         {} retryable errors (first: {:?}); completions after the restart per worker: {:?}",
        killed_at.elapsed(),
        new_leader.0,
        ledger.issued.values().map(Vec::len).sum::<usize>(),
        ledger.issued.len(),
        acked.len(),
        ledger.errors.len(),
        ledger.errors.first(),
        ledger.after_restart,
    );
    assert!(
        acked.len() > 100,
        "the workers barely worked: {}",
        acked.len()
    );
}

/// Minority partition: the member cut off from the other two refuses writes (a client that
/// reaches only it gets a retryable `Unavailable` within its bound, and a lease is never handed
/// out), a client of all three keeps working through the other two, and nothing acknowledged
/// before the cut is lost. Once the cut heals the member serves everything written meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cut_off_from_the_majority_refuses_writes_and_loses_nothing() {
    let Some(cluster) = required(
        "etcd cluster",
        EtcdCluster::start_isolatable().map_err(|e| e.to_string()),
        lease_conformance::fixtures::etcd::HINT,
    ) else {
        return;
    };
    let lone = MEMBERS - 1;
    let all: Vec<String> = (0..MEMBERS).map(|i| cluster.endpoint(i)).collect();
    let bound = Duration::from_secs(1);
    let majority = store(all, "minority", bound).await;
    let minority = store(vec![cluster.endpoint(lone)], "minority", bound).await;
    let w = WorkerId::new("w").unwrap();
    let ttl = Ttl::from_secs(30).unwrap();

    // Acknowledged before the cut: created, claimed, journaled, completed or held.
    let before: Vec<RunId> = (0..20).map(|i| id(&format!("before-{i:02}"))).collect();
    for r in majority.create_many(&before).await.unwrap() {
        r.unwrap();
    }
    let mut held = Vec::new();
    for (i, run) in before.iter().enumerate() {
        let lease = majority.claim(run, &w, ttl).await.unwrap();
        majority
            .append(&lease, format!("step {i}").as_bytes())
            .await
            .unwrap();
        if i % 2 == 0 {
            majority.complete(&lease).await.unwrap();
        } else {
            held.push(lease);
        }
    }

    let Some(mut cut) = required("iptables and ss", cluster.isolate(lone), LINK_CUT_HINT) else {
        return;
    };
    // Let the lone member notice it lost the leader (election timeout 500 ms).
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The lone member refuses: each write answers Unavailable, retryably, within its bound.
    let refused = id("during-refused");
    for attempt in 0..3 {
        let sent = Instant::now();
        let answer = minority.create(&refused).await;
        assert!(
            matches!(&answer, Err(e @ Error::Unavailable { .. }) if e.is_retryable()),
            "attempt {attempt}: the cut-off member answered {answer:?}"
        );
        assert!(sent.elapsed() < bound * 3, "took {:?}", sent.elapsed());
    }
    let claim = minority.claim(&before[1], &w, ttl).await;
    assert!(
        matches!(&claim, Err(Error::Unavailable { .. })),
        "a claim through the cut-off member answered {claim:?}"
    );

    // The client of all three fails over to the majority: with retries, everything goes on.
    let during: Vec<RunId> = (0..10).map(|i| id(&format!("during-{i:02}"))).collect();
    let retry = Duration::from_secs(20);
    let started = Instant::now();
    for run in &during {
        loop {
            match majority.create(run).await {
                Ok(_) | Err(Error::AlreadyExists { .. }) => break,
                Err(e) if e.is_retryable() && started.elapsed() < retry => {}
                Err(e) => panic!("create {run} through the majority: {e}"),
            }
        }
        let lease = loop {
            match majority.claim(run, &w, ttl).await {
                Ok(lease) => break lease,
                Err(e) if e.is_retryable() && started.elapsed() < retry => {}
                Err(e) => panic!("claim {run} through the majority: {e}"),
            }
        };
        assert_eq!(lease.fence().get(), 1, "{run}");
        loop {
            match majority.complete(&lease).await {
                Ok(())
                | Err(Error::LeaseEnded {
                    ended: Ended::Completed,
                    fence: 1,
                    ..
                }) => break,
                Err(e) if e.is_retryable() && started.elapsed() < retry => {}
                Err(e) => panic!("complete {run} through the majority: {e}"),
            }
        }
    }
    // Nothing acknowledged before the cut is lost: read through the majority, during the cut.
    for (i, run) in before.iter().enumerate() {
        let record = loop {
            match majority.inspect(run).await {
                Ok(record) => break record,
                Err(e) if e.is_retryable() && started.elapsed() < retry => {}
                Err(e) => panic!("inspect {run}: {e}"),
            }
        };
        let want = if i % 2 == 0 {
            RunState::Completed
        } else {
            RunState::Runnable
        };
        assert_eq!((record.state, record.fence.get()), (want, 1), "{run}");
        assert_eq!(record.owner.is_some(), i % 2 == 1, "{run}: still held");
    }
    for (i, lease) in held.iter().enumerate() {
        let journal = loop {
            match majority.journal(lease.run()).await {
                Ok(journal) => break journal,
                Err(e) if e.is_retryable() && started.elapsed() < retry => {}
                Err(e) => panic!("journal of {}: {e}", lease.run()),
            }
        };
        let step = format!("step {}", 2 * i + 1);
        assert_eq!(journal.len(), 1, "{}", lease.run());
        assert_eq!(journal[0].payload, step.as_bytes());
        loop {
            match majority.renew(lease).await {
                Ok(_) => break,
                Err(e) if e.is_retryable() && started.elapsed() < retry => {}
                Err(e) => panic!("renew {} during the cut: {e}", lease.run()),
            }
        }
    }
    cut.heal();
    // Healed: the lone member catches up and serves what the majority wrote meanwhile.
    let healed = Instant::now();
    for run in &during {
        loop {
            match minority.inspect(run).await {
                Ok(record) => {
                    assert_eq!(record.state, RunState::Completed, "{run}");
                    break;
                }
                Err(e) if e.is_retryable() && healed.elapsed() < retry => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("inspect {run} on the healed member: {e}"),
            }
        }
    }
}
