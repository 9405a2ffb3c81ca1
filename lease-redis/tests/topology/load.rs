//! Eight workers through a failover with `replicas=1`: fences only move forward across it, and
//! no effect lands twice.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, RwLock};
use std::time::{Duration, Instant};

use lease_conformance::fixtures::{unique_namespace, RedisOptions, RedisServer};
use lease_core::{LeaseStore, ListFilter, RunState};
use lease_redis::{FencedScript, RedisLeaseStore};

use super::{connect, raw, run, say, server, ttl, worker};

const WORKERS: usize = 8;
const RUNS: usize = 40;
/// Effects a run needs before its worker completes it (it releases it after the earlier ones),
/// so most runs are claimed several times and many are claimed on both sides of the failover.
const PASSES: i64 = 3;
const LEASE_MS: u64 = 1_000;

/// The effect: one ledger entry `fence:worker` per pass, written only under the current fence.
static EFFECT: LazyLock<FencedScript> =
    LazyLock::new(|| FencedScript::new("return redis.call('RPUSH', KEYS[1], ARGV[1])"));

/// What the workers share.
struct Shared {
    /// The store to use and its generation: 0 on the first primary, 1 on the promoted one.
    store: RwLock<(u64, Arc<RedisLeaseStore>)>,
    /// Every lease a worker held: run, fence, generation, worker.
    held: Mutex<Vec<(String, u64, u64, String)>>,
    /// Effects written.
    effects: AtomicU64,
    stop: AtomicBool,
}

/// The reference loop: claim the next run, do the work, write the effect under the fence, then
/// complete (after the last pass) or release. Any retryable failure abandons the lease, which
/// expires; a verdict means another worker has the run now.
async fn work(shared: Arc<Shared>, name: String) {
    let me = worker(&name);
    while !shared.stop.load(Ordering::Relaxed) {
        let (generation, store) = {
            let current = shared.store.read().unwrap();
            (current.0, current.1.clone())
        };
        let lease = match store.claim_next(&me, ttl(LEASE_MS), 1).await {
            Ok(mut leases) => match leases.pop() {
                Some(lease) => lease,
                None => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            Err(e) if e.is_retryable() => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            Err(e) => panic!("{name}: claim_next: {e:?}"),
        };
        let fence = lease.fence().get();
        shared.held.lock().unwrap().push((
            lease.run().as_str().to_owned(),
            fence,
            generation,
            name.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(5)).await; // the work
        let ledger = store.script_key(lease.run(), "ledger");
        let entry = format!("{fence}:{name}");
        let written = store
            .fenced_script::<i64, _, _>(&lease, &EFFECT, &[&ledger], &[&entry])
            .await;
        let ended = match written {
            Ok(len) => {
                shared.effects.fetch_add(1, Ordering::Relaxed);
                if len >= PASSES {
                    store.complete(&lease).await
                } else {
                    store.release(&lease).await
                }
            }
            Err(e) => Err(e),
        };
        match ended {
            Ok(()) => {}
            Err(e) if e.is_retryable() || e.is_verdict() => {}
            Err(e) => panic!("{name}: run {}: {e:?}", lease.run()),
        }
    }
}

/// The replication offset a replica has received.
fn received(replica: &RedisServer) -> u64 {
    replica
        .info("replication", "slave_repl_offset")
        .ok()
        .and_then(|o| o.parse().ok())
        .unwrap_or(0)
}

/// Eight workers run the reference loop with `replicas=1` against a primary with two
/// replicas; the primary is killed (SIGKILL) mid-load, the replica that received the most is
/// promoted (as Sentinel would), the other follows it, and the workers continue on the new
/// primary. Every fence issued after the failover is greater than every fence any worker held
/// before it, for each run; no effect is in the ledger twice, and each is under a fence a worker
/// held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_workers_through_a_failover_with_replicas_1_only_move_fences_forward() {
    let Some(mut primary) = server(RedisOptions::default()) else {
        return;
    };
    let Some(replica_a) = server(RedisOptions::default().with_replicaof(primary.port())) else {
        return;
    };
    let Some(replica_b) = server(RedisOptions::default().with_replicaof(primary.port())) else {
        return;
    };
    for replica in [&replica_a, &replica_b] {
        replica
            .wait_synced_to(&primary, Duration::from_secs(10))
            .unwrap();
    }
    let params = "?replicas=1&replica_timeout_ms=500";
    let ns = unique_namespace("load");
    let first = Arc::new(
        connect(&format!("{}{params}", primary.url()), &ns)
            .await
            .unwrap(),
    );
    let ids: Vec<String> = (0..RUNS).map(|i| format!("run-{i:02}")).collect();
    // Created without waiting for replicas (a slow fsync must not fail the setup); the workers'
    // first acknowledged claims cover them, as WAIT counts every earlier write.
    let setup = connect(&format!("{}?async_replicas=accept", primary.url()), &ns)
        .await
        .unwrap();
    for id in &ids {
        setup.create(&run(id)).await.unwrap();
    }
    let shared = Arc::new(Shared {
        store: RwLock::new((0, first)),
        held: Mutex::new(Vec::new()),
        effects: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    });
    let workers: Vec<_> = (0..WORKERS)
        .map(|i| tokio::spawn(work(shared.clone(), format!("w{i}"))))
        .collect();

    // Kill the primary a third of the way through.
    let deadline = Instant::now() + Duration::from_secs(20);
    while shared.effects.load(Ordering::Relaxed) < RUNS as u64 {
        assert!(Instant::now() < deadline, "the workers made no progress");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    primary.stop(); // SIGKILL
    let effects_before = shared.effects.load(Ordering::Relaxed);
    let (promoted, follower) = if received(&replica_a) >= received(&replica_b) {
        (&replica_a, &replica_b)
    } else {
        (&replica_b, &replica_a)
    };
    let offsets = (received(promoted), received(follower));
    promoted.command(&["REPLICAOF", "NO", "ONE"]).unwrap();
    let port = promoted.port().to_string();
    follower
        .command(&["REPLICAOF", "127.0.0.1", &port])
        .unwrap();
    follower
        .wait_synced_to(promoted, Duration::from_secs(10))
        .unwrap();
    let second = Arc::new(
        connect(&format!("{}{params}", promoted.url()), &ns)
            .await
            .unwrap(),
    );
    *shared.store.write().unwrap() = (1, second.clone());

    // Run until every run is completed on the new primary.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let filter = ListFilter::new()
            .with_state(Some(RunState::Completed))
            .with_limit(RUNS);
        let done = match second.list(&filter).await {
            Ok(done) => done.len(),
            Err(e) if e.is_retryable() => 0,
            Err(e) => panic!("list: {e:?}"),
        };
        if done == RUNS {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {done} of {RUNS} runs completed after the failover"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shared.stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }

    let held = shared.held.lock().unwrap().clone();
    let mut per_run: BTreeMap<&str, (Vec<u64>, Vec<u64>)> = BTreeMap::new();
    for (id, fence, generation, _) in &held {
        let entry = per_run.entry(id.as_str()).or_default();
        if *generation == 0 {
            entry.0.push(*fence);
        } else {
            entry.1.push(*fence);
        }
    }
    let mut spanning = Vec::new();
    for (id, (before, after)) in &per_run {
        if let (Some(highest_before), Some(lowest_after)) =
            (before.iter().max(), after.iter().min())
        {
            assert!(
                lowest_after > highest_before,
                "{id}: fence {lowest_after} issued after the failover, but a worker held \
                 {highest_before} before it (before {before:?}, after {after:?})"
            );
            spanning.push(format!("{id} {before:?} -> {after:?}"));
        }
    }
    assert!(
        !spanning.is_empty(),
        "no run was claimed on both sides of the failover: the test saw nothing"
    );

    let holders: BTreeMap<(&str, u64), &str> = held
        .iter()
        .map(|(id, f, _, w)| ((id.as_str(), *f), w.as_str()))
        .collect();
    let mut conn = raw(&promoted.url()).await;
    let mut ledger_entries = 0;
    for id in &ids {
        let key = second.script_key(&run(id), "ledger");
        let entries: Vec<String> = redis::cmd("LRANGE")
            .arg(&key)
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .unwrap();
        let written: Vec<(u64, &str)> = entries
            .iter()
            .map(|e| {
                let (fence, by) = e.split_once(':').expect("fence:worker");
                (fence.parse().unwrap(), by)
            })
            .collect();
        let fences: Vec<u64> = written.iter().map(|(f, _)| *f).collect();
        let distinct: BTreeSet<u64> = fences.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            fences.len(),
            "{id}: an effect is in the ledger twice: {entries:?}"
        );
        for (fence, by) in &written {
            assert_eq!(
                holders.get(&(id.as_str(), *fence)),
                Some(by),
                "{id}: an effect under fence {fence} by {by}, who did not hold it: {entries:?}"
            );
        }
        assert!(
            fences.len() >= PASSES as usize,
            "{id} completed with {entries:?}"
        );
        ledger_entries += fences.len();
    }
    let after = held.iter().filter(|(_, _, g, _)| *g == 1).count();
    say(&format!(
        "failover under load (replicas=1, {WORKERS} workers, {RUNS} runs): {} leases held \
         ({} before, {after} after); primary killed after {effects_before} effects; promoted \
         port {} (offset {}) over port {} (offset {}); {} runs claimed on both sides, every \
         one with higher fences after, e.g. {}; {ledger_entries} ledger entries, none twice",
        held.len(),
        held.len() - after,
        promoted.port(),
        offsets.0,
        follower.port(),
        offsets.1,
        spanning.len(),
        spanning
            .iter()
            .take(3)
            .cloned()
            .collect::<Vec<_>>()
            .join("; ")
    ));
}
