//! Measurements, not checks: the Redis server CPU and the throughput of a claim → renew →
//! release cycle through this adapter, next to the rslock-like cycle (`SET key val NX PX ttl`,
//! an EVALSHA extend script, an EVALSHA unlock script), on a private durable redis-server
//! (`appendonly yes`, `appendfsync always`).
//!
//! `cargo test -p lease-redis --release --test server_cpu -- --ignored --nocapture`
//!
//! Server CPU is `INFO commandstats` usec of the top-level commands (a script's usec includes
//! the commands it calls; fsync is not counted) divided by the cycles run.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use lease_conformance::fixtures::{unavailable, unique_namespace, RedisServer};
use lease_core::{LeaseStore, NewRun, RunId, Ttl, WorkerId};
use lease_redis::{RedisConfig, RedisLeaseStore};
use redis::aio::MultiplexedConnection;
use redis::Script;

mod support;
use support::{commandstats, reset};

const RUNS: usize = 1_000;
const CYCLES: usize = 5_000;
const ROUNDS: usize = 5;
const THROUGHPUT_FOR: Duration = Duration::from_secs(3);
const EXTEND: &str = "if redis.call('get',KEYS[1])==ARGV[1] then return redis.call('pexpire',KEYS[1],ARGV[2]) else return 0 end";
const UNLOCK: &str =
    "if redis.call('get',KEYS[1])==ARGV[1] then return redis.call('del',KEYS[1]) else return 0 end";

async fn raw(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection_with_config(
            // A server busy with an fsync must not fail the test's own reads (the default is 500 ms).
            &redis::AsyncConnectionConfig::new()
                .set_response_timeout(Some(std::time::Duration::from_secs(30))),
        )
        .await
        .unwrap()
}

/// Prints the top-level commands' µs per cycle and returns their sum.
async fn report(label: &str, conn: &mut MultiplexedConnection, top: &[&str], cycles: usize) -> f64 {
    let stats = commandstats(conn).await;
    let mut total = 0.0;
    let mut parts = Vec::new();
    for name in top {
        let (calls, usec) = stats.get(*name).copied().unwrap_or((0, 0));
        total += usec as f64 / cycles as f64;
        parts.push(format!(
            "{name}: {calls} calls, {:.2} µs/call",
            usec as f64 / calls.max(1) as f64
        ));
    }
    let mut nested: Vec<_> = stats
        .iter()
        .filter(|(name, _)| !top.contains(&name.as_str()) && *name != "config")
        .map(|(name, (calls, usec))| format!("{name} {calls}×{:.2}", *usec as f64 / *calls as f64))
        .collect();
    nested.sort();
    println!(
        "{label}: {total:.2} µs server CPU per cycle ({}); inside: {}",
        parts.join("; "),
        nested.join(", ")
    );
    total
}

async fn store(url: &str, namespace: &str) -> RedisLeaseStore {
    RedisLeaseStore::connect(RedisConfig::from_url(url).with_namespace(namespace))
        .await
        .unwrap()
}

async fn our_cycle(store: &RedisLeaseStore, run: &RunId, worker: &WorkerId, ttl: Ttl) {
    let lease = store.claim(run, worker, ttl).await.unwrap();
    let lease = store.renew(&lease).await.unwrap();
    store.release(&lease).await.unwrap();
}

async fn rslock_cycle(
    conn: &mut MultiplexedConnection,
    extend: &Script,
    unlock: &Script,
    key: &str,
    token: &str,
) {
    let set: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(conn)
        .await
        .unwrap();
    assert!(set.is_some(), "lock {key} was held");
    let extended: i64 = extend
        .key(key)
        .arg(token)
        .arg(30_000)
        .invoke_async(conn)
        .await
        .unwrap();
    assert_eq!(extended, 1);
    let unlocked: i64 = unlock.key(key).arg(token).invoke_async(conn).await.unwrap();
    assert_eq!(unlocked, 1);
}

/// A private durable server (`appendonly yes`, `appendfsync always`).
fn server() -> Option<RedisServer> {
    match RedisServer::start() {
        Ok(server) => Some(server),
        Err(why) => unavailable("redis-server", why, "install redis-server"),
    }
}

fn ids(prefix: &str, n: usize) -> Vec<RunId> {
    (0..n)
        .map(|i| RunId::new(format!("{prefix}-{i:05}")).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn server_cpu_per_cycle_ours_and_rslock_like() {
    let Some(server) = server() else {
        return;
    };
    let url = server.url();
    let mut admin = raw(&url).await;
    let ttl = Ttl::from_secs(30).unwrap();
    let worker = WorkerId::new("worker-0").unwrap();

    let ours = store(&url, &unique_namespace("cpu")).await;
    let runs = ids("run", RUNS);
    for chunk in runs.chunks(500) {
        ours.create_many(chunk).await.unwrap();
    }
    for run in runs.iter().take(10) {
        our_cycle(&ours, run, &worker, ttl).await; // loads the scripts
    }
    let mut conn = raw(&url).await;
    let (extend, unlock) = (Script::new(EXTEND), Script::new(UNLOCK));
    let keys: Vec<String> = (0..RUNS).map(|i| format!("lock:{i:05}")).collect();
    rslock_cycle(&mut conn, &extend, &unlock, &keys[0], "warm").await;
    // The machine is shared: alternate the two, and keep each one's best round.
    let (mut ours_us, mut rslock_us) = (f64::MAX, f64::MAX);
    for round in 0..ROUNDS {
        reset(&mut admin).await;
        for i in 0..CYCLES {
            our_cycle(&ours, &runs[i % RUNS], &worker, ttl).await;
        }
        let us = report(
            &format!("round {round} ours"),
            &mut admin,
            &["evalsha"],
            CYCLES,
        )
        .await;
        ours_us = ours_us.min(us);
        reset(&mut admin).await;
        for i in 0..CYCLES {
            let token = format!("token-{round}-{i}");
            rslock_cycle(&mut conn, &extend, &unlock, &keys[i % RUNS], &token).await;
        }
        let label = format!("round {round} rslock-like");
        let us = report(&label, &mut admin, &["set", "evalsha"], CYCLES).await;
        rslock_us = rslock_us.min(us);
    }
    println!("best: ours {ours_us:.2} µs, rslock-like {rslock_us:.2} µs per cycle");
    println!("ours ÷ rslock-like server CPU: {:.2}", ours_us / rslock_us);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn cycles_per_second_ours_and_rslock_like() {
    let Some(server) = server() else {
        return;
    };
    let url = server.url();
    let ttl = Ttl::from_secs(30).unwrap();
    for clients in [1, 4, 16] {
        let ns = unique_namespace("tput");
        let setup = store(&url, &ns).await;
        let mut tasks = Vec::new();
        for c in 0..clients {
            let runs = ids(&format!("c{c}"), RUNS / clients);
            setup.create_many(&runs).await.unwrap();
            let mine = store(&url, &ns).await; // one connection per client, as one per worker
            let worker = WorkerId::new(format!("worker-{c}")).unwrap();
            tasks.push(tokio::spawn(async move {
                let until = Instant::now() + THROUGHPUT_FOR;
                let mut n = 0usize;
                while Instant::now() < until {
                    our_cycle(&mine, &runs[n % runs.len()], &worker, ttl).await;
                    n += 1;
                }
                n
            }));
        }
        let mut ours = 0;
        for task in tasks {
            ours += task.await.unwrap();
        }

        let mut tasks = Vec::new();
        for c in 0..clients {
            let mut conn = raw(&url).await;
            let prefix = unique_namespace("lock");
            tasks.push(tokio::spawn(async move {
                let (extend, unlock) = (Script::new(EXTEND), Script::new(UNLOCK));
                let until = Instant::now() + THROUGHPUT_FOR;
                let mut n = 0usize;
                while Instant::now() < until {
                    let key = format!("{prefix}:{c}:{}", n % RUNS);
                    let token = format!("token-{n}");
                    rslock_cycle(&mut conn, &extend, &unlock, &key, &token).await;
                    n += 1;
                }
                n
            }));
        }
        let mut rslock = 0;
        for task in tasks {
            rslock += task.await.unwrap();
        }
        let per_s = |n: usize| n as f64 / THROUGHPUT_FOR.as_secs_f64();
        println!(
            "{clients:>2} clients: ours {:.0} cycles/s, rslock-like {:.0} cycles/s ({:.2}×)",
            per_s(ours),
            per_s(rslock),
            ours as f64 / rslock as f64
        );
    }
}

/// Server µs per run claimed by `claim_next` in batches of 100, runs without a payload and
/// runs with 1 KiB each, alternating, one client: what handing out a payload costs the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn claim_next_per_run_with_and_without_payloads() {
    const BATCH: usize = 100;
    const CLAIMED: usize = 2_000;
    let Some(server) = server() else { return };
    let url = server.url();
    let mut conn = raw(&url).await;
    let worker = WorkerId::new("w").unwrap();
    let ttl = Ttl::from_secs(60).unwrap();
    let mut per_run: HashMap<&str, Vec<f64>> = HashMap::new();
    for round in 0..ROUNDS {
        for (label, bytes) in [("no payload", 0), ("1 KiB payloads", 1024)] {
            let store = store(&url, &unique_namespace("payload-cost")).await;
            // Loads the script outside the count.
            assert!(store
                .claim_next(&worker, ttl, BATCH)
                .await
                .unwrap()
                .is_empty());
            let runs: Vec<NewRun> = ids(&format!("r{round}-"), CLAIMED)
                .into_iter()
                .map(|id| match bytes {
                    0 => NewRun::new(id),
                    n => NewRun::new(id).with_payload(vec![b'p'; n]),
                })
                .collect();
            for chunk in runs.chunks(500) {
                for created in store.create_many_with(chunk).await.unwrap() {
                    created.unwrap();
                }
            }
            reset(&mut conn).await;
            let mut claimed = 0;
            while claimed < CLAIMED {
                let leases = store.claim_next(&worker, ttl, BATCH).await.unwrap();
                assert!(!leases.is_empty(), "{claimed} of {CLAIMED} claimed");
                for lease in &leases {
                    assert_eq!(lease.payload().map_or(0, <[u8]>::len), bytes);
                }
                claimed += leases.len();
            }
            let label_round = format!("round {round}, claim_next of {BATCH}, {label}, per run");
            let us = report(&label_round, &mut conn, &["evalsha", "hmget"], CLAIMED).await;
            per_run.entry(label).or_default().push(us);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let plain = median(per_run.get_mut("no payload").unwrap());
    let payload = median(per_run.get_mut("1 KiB payloads").unwrap());
    println!(
        "medians: {plain:.2} µs per run without a payload, {payload:.2} with 1 KiB: {:.2}×",
        payload / plain
    );
}
