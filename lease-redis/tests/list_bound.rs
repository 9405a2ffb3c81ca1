//! A filtered `list` on a large namespace never stalls the heartbeats of other clients: the
//! adapter examines at most 1,000 run ids per script call and pages with a cursor, so a renewal
//! waits behind one short script call at most, never behind a scan of the whole namespace.
//!
//! On a private durable server (`appendonly yes`, `appendfsync always`, the fixtures'
//! default) holding 200,000 runs, of which a few are suspended, `list(state = suspended)` walks
//! the whole namespace while another client renews a lease in a loop; the worst renewal
//! latency is asserted under [`BOUND`].
//!
//! The figure of BENCHMARKS.md ("list vs renewal on Redis, 200k runs"):
//! `cargo test --release -p lease-redis --test list_bound -- --ignored --nocapture`
//! (`just list-bound`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_conformance::fixtures::{unavailable, unique_namespace, RedisOptions, RedisServer};
use lease_core::{Lease, LeaseStore, ListFilter, RunId, RunState, Ttl, WorkerId};
use lease_redis::{RedisConfig, RedisLeaseStore};
use redis::aio::MultiplexedConnection;

/// Runs in the namespace.
const RUNS: usize = 200_000;
/// Suspended runs, spread evenly over the id range: what the filtered list finds.
const SUSPENDED: usize = 20;
/// The worst renewal latency allowed while lists run. A scan of the whole namespace in one
/// script takes hundreds of milliseconds; one page of 1,000 ids takes about one.
const BOUND: Duration = Duration::from_millis(50);

/// A private durable server (the fixtures' default options).
fn server() -> Option<RedisServer> {
    match RedisServer::start_options(RedisOptions::default()) {
        Ok(server) => Some(server),
        Err(why) => unavailable(
            "redis-server",
            why,
            "install redis-server (bash scripts/test.sh does it)",
        ),
    }
}

async fn store(url: &str, namespace: &str) -> RedisLeaseStore {
    RedisLeaseStore::connect(RedisConfig::from_url(url).with_namespace(namespace))
        .await
        .expect("connect")
}

async fn raw(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection_with_config(
            // A server busy with an fsync must not fail the test's own reads (the default is 500 ms).
            &redis::AsyncConnectionConfig::new()
                .set_response_timeout(Some(std::time::Duration::from_secs(30))),
        )
        .await
        .expect("connect")
}

async fn command(conn: &mut MultiplexedConnection, args: &[&str]) -> redis::Value {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query_async(conn).await.expect("admin command")
}

/// `calls` and `usec` of `cmdstat_evalsha` in `INFO commandstats`: the script calls since the
/// last reset and the server time they took.
async fn script_calls(conn: &mut MultiplexedConnection) -> (u64, u64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO");
    let line = info
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:"))
        .unwrap_or_default();
    let field = |key: &str| -> u64 {
        line.split(',')
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("calls"), field("usec"))
}

/// The latency monitor's worst figure per event since it was reset, in milliseconds
/// (`LATENCY LATEST`: `command` is the longest command, a script call included;
/// `aof-fsync-always` the longest fsync; events under 1 ms are not recorded).
async fn latency_events(conn: &mut MultiplexedConnection) -> Vec<(String, u64)> {
    let latest: Vec<(String, u64, u64, u64)> = redis::cmd("LATENCY")
        .arg("LATEST")
        .query_async(conn)
        .await
        .expect("LATENCY LATEST");
    let mut events: Vec<(String, u64)> = latest
        .into_iter()
        .map(|(event, _, _, max)| (event, max))
        .collect();
    events.sort();
    events
}

/// The worst figure of `event` in [`latency_events`], 0 when none reached 1 ms.
fn event_ms(events: &[(String, u64)], event: &str) -> u64 {
    events
        .iter()
        .filter(|(name, _)| name == event)
        .map(|(_, max)| *max)
        .max()
        .unwrap_or(0)
}

fn id(i: usize) -> RunId {
    RunId::new(format!("run-{i:06}")).expect("id")
}

fn suspended_ids() -> Vec<RunId> {
    (0..SUSPENDED)
        .map(|k| id(k * (RUNS / SUSPENDED) + 7))
        .collect()
}

fn filter() -> ListFilter {
    ListFilter::new()
        .with_state(RunState::Suspended)
        .with_limit(1_000)
}

/// A namespace of [`RUNS`] runs, a holder renewing a lease on its own connection, and what
/// one filtered list alone costs.
struct Bench {
    setup: RedisLeaseStore,
    holder: Arc<RedisLeaseStore>,
    lease: Lease,
    admin: MultiplexedConnection,
    /// One filtered list alone: its duration, its script calls and their server time (µs).
    one_list: Duration,
    calls: u64,
    server_us: u64,
}

/// One round: renewals while filtered lists walk the namespace.
struct Round {
    /// Filtered lists completed while renewing.
    lists: usize,
    /// Renewal latencies, sorted.
    during: Vec<Duration>,
    /// The server's latency monitor during the round: worst ms per event.
    events: Vec<(String, u64)>,
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn worst(sorted: &[Duration]) -> Duration {
    sorted.last().copied().unwrap_or_default()
}

/// Renews `lease` in a loop on its own connection until `stop`, returning the renewed lease and
/// each latency, sorted.
async fn renew_until(
    store: Arc<RedisLeaseStore>,
    mut lease: Lease,
    stop: Arc<AtomicBool>,
) -> (Lease, Vec<Duration>) {
    let mut latencies = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let sent = Instant::now();
        lease = store.renew(&lease).await.expect("renew");
        latencies.push(sent.elapsed());
    }
    latencies.sort();
    (lease, latencies)
}

impl Bench {
    async fn new(url: &str) -> Bench {
        let ns = unique_namespace("list_bound");
        let setup = store(url, &ns).await;
        let ids: Vec<RunId> = (0..RUNS).map(id).collect();
        for chunk in ids.chunks(1_000) {
            for created in setup.create_many(chunk).await.expect("create_many") {
                created.expect("created");
            }
        }
        let worker = WorkerId::new("worker-a").expect("worker");
        let ttl = Ttl::from_secs(60).expect("ttl");
        for run in suspended_ids() {
            let lease = setup.claim(&run, &worker, ttl).await.expect("claim");
            setup.suspend(&lease).await.expect("suspend");
        }
        let mut admin = raw(url).await;

        // One filtered list alone: how long it takes and how many script calls it makes.
        assert_eq!(setup.list(&filter()).await.expect("list").len(), SUSPENDED);
        command(&mut admin, &["CONFIG", "RESETSTAT"]).await;
        let started = Instant::now();
        let found = setup.list(&filter()).await.expect("list");
        let one_list = started.elapsed();
        let (calls, server_us) = script_calls(&mut admin).await;
        let found: Vec<RunId> = found.into_iter().map(|r| r.run).collect();
        assert_eq!(
            found,
            suspended_ids(),
            "the filtered list finds every match"
        );

        // A heartbeating holder on its own connection, as a worker would be.
        let holder = Arc::new(store(url, &ns).await);
        let lease = holder.claim(&id(1), &worker, ttl).await.expect("claim");
        command(
            &mut admin,
            &["CONFIG", "SET", "latency-monitor-threshold", "1"],
        )
        .await;
        Bench {
            setup,
            holder,
            lease,
            admin,
            one_list,
            calls,
            server_us,
        }
    }

    /// Renewal latencies, sorted, while nothing else runs for `idle_for`.
    async fn idle(&mut self, idle_for: Duration) -> Vec<Duration> {
        let stop = Arc::new(AtomicBool::new(false));
        let idle = tokio::spawn(renew_until(
            self.holder.clone(),
            self.lease.clone(),
            stop.clone(),
        ));
        tokio::time::sleep(idle_for).await;
        stop.store(true, Ordering::Relaxed);
        let (lease, idle) = idle.await.expect("renewer");
        self.lease = lease;
        idle
    }

    /// Renews while `lists` filtered lists run one after another.
    async fn round(&mut self, lists: usize) -> Round {
        command(&mut self.admin, &["LATENCY", "RESET"]).await;
        let stop = Arc::new(AtomicBool::new(false));
        let during = tokio::spawn(renew_until(
            self.holder.clone(),
            self.lease.clone(),
            stop.clone(),
        ));
        // Let the renewer start before the first list.
        tokio::time::sleep(Duration::from_millis(50)).await;
        for _ in 0..lists {
            assert_eq!(
                self.setup.list(&filter()).await.expect("list").len(),
                SUSPENDED
            );
        }
        stop.store(true, Ordering::Relaxed);
        let (lease, during) = during.await.expect("renewer");
        self.lease = lease;
        let events = latency_events(&mut self.admin).await;
        Round {
            lists,
            during,
            events,
        }
    }
}

/// A filtered list walking 200,000 runs never delays a concurrent renewal by more than
/// [`BOUND`] (beyond the disk's own fsync stalls), no server command takes that long, and the
/// list makes one script call per 1,000 runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_list_of_200k_runs_never_blocks_a_renewal() {
    let Some(server) = server() else {
        return;
    };
    let mut bench = Bench::new(&server.url()).await;
    let said = format!(
        "one list took {:?} in {} script calls",
        bench.one_list, bench.calls
    );
    // A renewal is a write and waits for its fsync (`appendfsync always`); a disk shared with
    // other work stalls an fsync now and then, and the list (read-only) cannot cause that. So
    // the bound holds for the renewal's latency beyond the worst fsync of the same round, and
    // for every command the server ran: a list's script call is one of them. A machine
    // shared with other work also deschedules the server now and then, so a round may be
    // repeated: a list that blocks the server fails every round, a stray stall does not.
    let (mut rounds, mut passed) = (Vec::new(), false);
    for _ in 0..3 {
        let round = bench.round(3).await;
        assert!(
            round.during.len() >= 20,
            "only {} renewals ran during the lists",
            round.during.len()
        );
        let fsync_ms = event_ms(&round.events, "aof-fsync-always");
        let longest_ms = event_ms(&round.events, "command");
        let worst = worst(&round.during);
        rounds.push(format!(
            "worst renewal {worst:?} (allowed {:?}), longest server command {longest_ms} ms, \
             worst fsync {fsync_ms} ms",
            BOUND + Duration::from_millis(fsync_ms)
        ));
        if worst < BOUND + Duration::from_millis(fsync_ms)
            && Duration::from_millis(longest_ms) < BOUND
        {
            passed = true;
            break;
        }
    }
    assert!(
        passed,
        "a renewal waited too long or a server command took {BOUND:?} or more in every round \
         ({said}): {}",
        rounds.join("; ")
    );
    assert!(
        bench.calls >= (RUNS / 1_000) as u64,
        "{said}; paging by 1,000 ids needs at least {}",
        RUNS / 1_000
    );
    eprintln!("{said}; {}", rounds.join("; "));
}

/// The figure of BENCHMARKS.md: renewal latency while filtered lists run, next to idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: cargo test --release -p lease-redis --test list_bound -- --ignored --nocapture"]
async fn list_vs_renewal_figure() {
    let Some(server) = server() else {
        return;
    };
    let mut bench = Bench::new(&server.url()).await;
    let idle = bench.idle(Duration::from_secs(4)).await;
    let f = bench.round(10).await;
    println!(
        "{RUNS} runs, {SUSPENDED} suspended; redis-server with appendonly yes, appendfsync always"
    );
    println!(
        "one filtered list (state = suspended): {:.1} ms in {} script calls ({:.2} ms of server time per call)",
        bench.one_list.as_secs_f64() * 1e3,
        bench.calls,
        bench.server_us as f64 / 1e3 / bench.calls.max(1) as f64
    );
    for (label, sorted) in [
        ("idle (4 s, no list)", &idle),
        (&*format!("during {} lists", f.lists), &f.during),
    ] {
        println!(
            "renew {label}: {} renewals, p50 {:.2} ms, p99 {:.2} ms, worst {:.2} ms",
            sorted.len(),
            quantile(sorted, 0.5).as_secs_f64() * 1e3,
            quantile(sorted, 0.99).as_secs_f64() * 1e3,
            worst(sorted).as_secs_f64() * 1e3
        );
    }
    println!(
        "longest single server command during the lists: {} ms; latency monitor (ms, events of 1 ms or more): {:?}",
        event_ms(&f.events, "command"),
        f.events
    );
}
