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
        .get_multiplexed_async_connection()
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

/// `calls` of `cmdstat_evalsha` in `INFO commandstats`: the script calls since the last reset.
async fn script_calls(conn: &mut MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO");
    info.lines()
        .filter_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .filter_map(|rest| rest.split(',').next()?.parse::<u64>().ok())
        .sum()
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
    ListFilter {
        state: Some(RunState::Suspended),
        limit: 1_000,
        ..ListFilter::default()
    }
}

/// What one measurement found.
struct Figures {
    /// Renewal latencies while nothing else ran, sorted.
    idle: Vec<Duration>,
    /// Renewal latencies while filtered lists walked the namespace, sorted.
    during: Vec<Duration>,
    /// Filtered lists completed while renewing.
    lists: usize,
    /// One filtered list alone: its duration and its script calls.
    one_list: Duration,
    calls: u64,
    /// The server's latency monitor during the lists: worst ms per event.
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

async fn measure(url: &str, lists: usize) -> Figures {
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
    let calls = script_calls(&mut admin).await;
    let found: Vec<RunId> = found.into_iter().map(|r| r.run).collect();
    assert_eq!(
        found,
        suspended_ids(),
        "the filtered list finds every match"
    );

    // A heartbeating holder on its own connection, as a worker would be.
    let holder = Arc::new(store(url, &ns).await);
    let lease = holder.claim(&id(1), &worker, ttl).await.expect("claim");
    let stop = Arc::new(AtomicBool::new(false));
    let idle = tokio::spawn(renew_until(holder.clone(), lease.clone(), stop.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let (lease, idle) = idle.await.expect("renewer");

    command(
        &mut admin,
        &["CONFIG", "SET", "latency-monitor-threshold", "1"],
    )
    .await;
    command(&mut admin, &["LATENCY", "RESET"]).await;
    let stop = Arc::new(AtomicBool::new(false));
    let during = tokio::spawn(renew_until(holder.clone(), lease, stop.clone()));
    // Let the renewer start before the first list.
    tokio::time::sleep(Duration::from_millis(50)).await;
    for _ in 0..lists {
        assert_eq!(setup.list(&filter()).await.expect("list").len(), SUSPENDED);
    }
    stop.store(true, Ordering::Relaxed);
    let (_, during) = during.await.expect("renewer");
    let events = latency_events(&mut admin).await;
    Figures {
        idle,
        during,
        lists,
        one_list,
        calls,
        events,
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
    let figures = measure(&server.url(), 3).await;
    assert!(
        figures.during.len() >= 20,
        "only {} renewals ran during the lists",
        figures.during.len()
    );
    // A renewal is a write and waits for its fsync (`appendfsync always`); a disk shared with
    // other work stalls an fsync now and then, and the list (read-only) cannot cause that. So
    // the bound holds for the renewal's latency beyond the worst fsync of the same period, and
    // for every command the server ran: a list's script call is one of them.
    let fsync_ms = event_ms(&figures.events, "aof-fsync-always");
    let longest_ms = event_ms(&figures.events, "command");
    let worst = worst(&figures.during);
    let allowed = BOUND + Duration::from_millis(fsync_ms);
    let said = format!(
        "worst renewal {worst:?} while lists ran; longest server command {longest_ms} ms; \
         worst fsync {fsync_ms} ms; one list took {:?} in {} script calls",
        figures.one_list, figures.calls
    );
    assert!(worst < allowed, "{said}: over {allowed:?}");
    assert!(
        Duration::from_millis(longest_ms) < BOUND,
        "{said}: a server command took {BOUND:?} or more"
    );
    assert!(
        figures.calls >= (RUNS / 1_000) as u64,
        "one filtered list made {} script calls; paging by 1,000 ids needs at least {}",
        figures.calls,
        RUNS / 1_000
    );
    eprintln!("{said}");
}

/// The figure of BENCHMARKS.md: renewal latency while filtered lists run, next to idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: cargo test --release -p lease-redis --test list_bound -- --ignored --nocapture"]
async fn list_vs_renewal_figure() {
    let Some(server) = server() else {
        return;
    };
    let f = measure(&server.url(), 10).await;
    println!(
        "{RUNS} runs, {SUSPENDED} suspended; redis-server with appendonly yes, appendfsync always"
    );
    println!(
        "one filtered list (state = suspended): {:.1} ms in {} script calls ({:.2} ms per call)",
        f.one_list.as_secs_f64() * 1e3,
        f.calls,
        f.one_list.as_secs_f64() * 1e3 / f.calls.max(1) as f64
    );
    for (label, sorted) in [
        ("idle", &f.idle),
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
