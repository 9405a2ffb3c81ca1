//! Throughput and p99 latency of the etcd backend beside etcd's own lock service (the
//! `etcdctl lock` acquire/release path), both measured in the same run on a private
//! three-member cluster on loopback (figures in BENCHMARKS.md):
//! `cargo test --release -p lease-etcd --test bench -- --ignored --nocapture`.
//!
//! Ignored in `cargo test`: it starts its own cluster and makes about 30,000 calls to it.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_conformance::fixtures::etcd::{EtcdCluster, EtcdFixture, MEMBERS};
use lease_core::{End, Ending, Lease, LeaseStore, RunId, RunState, Ttl, WorkerId, MAX_BATCH};
use lease_etcd::rpc::Client;

/// Concurrent tasks per row, the same for the library's rows and the peer's.
const TASKS: usize = 8;

/// Operations in each of the claim, renew and acquire-only rows.
const OPS: usize = 2_000;

/// Cycles of the peer's acquire + release in each slice: one slice before the first row and
/// one after each row.
const PEER_SLICE: usize = 400;

/// Unmeasured operations before the rows, to open connections and warm etcd up.
const WARM_UP: usize = 64;

/// `claim_next` calls, each asking for [`CLAIM_NEXT_MAX`] leases.
const CLAIM_NEXT_CALLS: usize = 400;

/// The `max` of each `claim_next` call.
const CLAIM_NEXT_MAX: usize = 10;

/// Runnable runs beyond what the `claim_next` calls can take, so that none runs dry.
const CLAIM_NEXT_SLACK: usize = 1_000;

/// Completes per `end_many` call; the row ends every lease `claim_next` handed out.
const END_BATCH: usize = 100;

/// The TTL of every lease, the library's and the peer's: etcd leases are whole seconds.
const TTL_SECS: u64 = 30;

/// What one row measured.
struct Row {
    name: String,
    /// Leases (or locks) the row handled.
    items: usize,
    /// Calls made (one latency each).
    calls: usize,
    wall: Duration,
    latencies: Vec<Duration>,
}

impl Row {
    fn new(name: &str, items: usize, wall: Duration, latencies: Vec<Duration>) -> Row {
        Row {
            name: name.to_string(),
            items,
            calls: latencies.len(),
            wall,
            latencies,
        }
    }

    fn per_second(&self) -> f64 {
        self.items as f64 / self.wall.as_secs_f64()
    }

    fn percentile_ms(&self, p: f64) -> f64 {
        let mut sorted = self.latencies.clone();
        sorted.sort_unstable();
        let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        sorted[rank - 1].as_secs_f64() * 1_000.0
    }
}

/// What [`measure`] returns: the wall time of the whole row, each call's latency, and each
/// call's result.
struct Measured<R> {
    wall: Duration,
    latencies: Vec<Duration>,
    results: Vec<R>,
}

/// Runs `op` on every item with [`TASKS`] concurrent tasks (item `i` on task `i % TASKS`,
/// each task one call at a time), timing each call and the whole row.
async fn measure<I, R, F, Fut>(items: Vec<I>, op: F) -> Measured<R>
where
    I: Send + 'static,
    R: Send + 'static,
    F: Fn(I) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = R> + Send,
{
    let op = Arc::new(op);
    let mut queues: Vec<Vec<I>> = (0..TASKS).map(|_| Vec::new()).collect();
    for (i, item) in items.into_iter().enumerate() {
        queues[i % TASKS].push(item);
    }
    let start = Instant::now();
    let tasks: Vec<_> = queues
        .into_iter()
        .map(|queue| {
            let op = Arc::clone(&op);
            tokio::spawn(async move {
                let mut out = Vec::with_capacity(queue.len());
                for item in queue {
                    let sent = Instant::now();
                    let result = op(item).await;
                    out.push((sent.elapsed(), result));
                }
                out
            })
        })
        .collect();
    let mut latencies = Vec::new();
    let mut results = Vec::new();
    for task in tasks {
        for (latency, result) in task.await.expect("a bench task panicked") {
            latencies.push(latency);
            results.push(result);
        }
    }
    Measured {
        wall: start.elapsed(),
        latencies,
        results,
    }
}

/// Creates `n` runs named `{tag}-{i}` with `create_many` in batches of 1,000.
async fn create_runs(store: &dyn LeaseStore, tag: &str, n: usize) -> Vec<RunId> {
    let runs: Vec<RunId> = (0..n)
        .map(|i| RunId::new(format!("{tag}-{i}")).expect("a run id"))
        .collect();
    for batch in runs.chunks(MAX_BATCH) {
        for (run, created) in batch
            .iter()
            .zip(store.create_many(batch).await.expect("create"))
        {
            created.unwrap_or_else(|e| panic!("create {run}: {e}"));
        }
    }
    runs
}

/// Reads every run back and checks it is runnable, held by `owner`, at fence 1, with
/// `heartbeats` renewals recorded.
async fn check_held(store: &dyn LeaseStore, runs: &[RunId], owner: &WorkerId, heartbeats: u64) {
    for batch in runs.chunks(MAX_BATCH) {
        for (run, record) in batch
            .iter()
            .zip(store.inspect_many(batch).await.expect("inspect"))
        {
            let record = record.unwrap_or_else(|e| panic!("inspect {run}: {e}"));
            assert_eq!(record.state, RunState::Runnable, "{run}");
            assert_eq!(record.fence.get(), 1, "{run}");
            assert_eq!(record.owner.as_ref(), Some(owner), "{run}");
            assert_eq!(record.heartbeats, heartbeats, "{run}");
        }
    }
}

/// etcd's lock, as `etcdctl lock` takes it: a lease of [`TTL_SECS`], then `lock` under it.
/// Returns the lock's key (the name, a slash, the lease id in hex).
async fn acquire(client: &Client, name: String) -> String {
    let mut client = client.clone();
    let granted = client
        .lease_grant(TTL_SECS as i64)
        .await
        .expect("lease grant");
    let locked = client.lock(name.clone(), granted.id()).await.expect("lock");
    let key = String::from_utf8(locked.key().to_vec()).expect("a UTF-8 lock key");
    assert!(
        key.starts_with(&format!("{name}/")),
        "{key} is not under {name}"
    );
    key
}

/// Acquires the lock `name` and releases it (`unlock`), as one `etcdctl lock` command does.
async fn acquire_release(client: &Client, name: String) -> String {
    let key = acquire(client, name).await;
    client.clone().unlock(key.clone()).await.expect("unlock");
    key
}

/// The 1-, 5- and 15-minute load averages, to show the machine was idle.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_string())
}

/// Checks that every lock call returned its own key.
fn assert_unique_keys(keys: &[String]) {
    let distinct: HashSet<&String> = keys.iter().collect();
    assert_eq!(distinct.len(), keys.len(), "two lock calls got one key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: starts a three-member etcd cluster and makes ~30,000 calls; run with --release -- --ignored --nocapture"]
async fn etcd_throughput_beside_etcds_own_lock() {
    let started = Instant::now();
    let load_at_start = load_average();
    let mut cluster = EtcdCluster::start().expect("a three-member etcd cluster");
    let leader = cluster
        .leader(Duration::from_secs(10))
        .expect("the cluster's leader");
    let endpoints: Vec<String> = (0..MEMBERS).map(|i| cluster.endpoint(i)).collect();
    let fixture = EtcdFixture::new(endpoints.clone());
    let (etcd_store, etcd_queue) = (
        Arc::new(fixture.store().await),
        Arc::new(fixture.store().await),
    );
    let store: Arc<dyn LeaseStore> = etcd_store.clone();
    let queue: Arc<dyn LeaseStore> = etcd_queue.clone();
    // The etcd leases the library granted: marked before the first row and after each.
    let granted = || etcd_store.leases_granted() + etcd_queue.leases_granted();
    let client = Client::connect(endpoints.clone(), None)
        .await
        .expect("etcd client");
    let ttl = Ttl::from_secs(TTL_SECS).expect("ttl");
    let worker = WorkerId::new("bench").expect("worker id");
    let lock_prefix = format!("bench-lock-{}", std::process::id());

    // Setup, not measured: the claim row's runs, the claim_next backlog, a warm-up of each.
    let runs = create_runs(&*store, "claim", OPS).await;
    let backlog = CLAIM_NEXT_CALLS * CLAIM_NEXT_MAX + CLAIM_NEXT_SLACK;
    create_runs(&*queue, "queued", backlog).await;
    let warm = create_runs(&*store, "warm", WARM_UP).await;
    {
        let (store, worker) = (Arc::clone(&store), worker.clone());
        measure(warm, move |run| {
            let (store, worker) = (Arc::clone(&store), worker.clone());
            async move {
                store
                    .claim(&run, &worker, ttl)
                    .await
                    .expect("warm-up claim")
            }
        })
        .await;
        let (client, prefix) = (client.clone(), lock_prefix.clone());
        measure((0..WARM_UP).collect(), move |i: usize| {
            let (client, name) = (client.clone(), format!("{prefix}/warm/{i}"));
            async move { acquire_release(&client, name).await }
        })
        .await;
    }

    // The peer's cycle in slices of PEER_SLICE, one before the first row, one after each:
    // every row's ratios are against the slices right before and after it, so a drift of
    // the cluster or the machine over the run falls on both sides of each ratio.
    let peer_slice = |k: usize| {
        let (client, prefix) = (client.clone(), lock_prefix.clone());
        measure((0..PEER_SLICE).collect(), move |i: usize| {
            let (client, name) = (client.clone(), format!("{prefix}/cycle-{k}/{i}"));
            async move { acquire_release(&client, name).await }
        })
    };
    let mut slices: Vec<Measured<String>> = vec![peer_slice(0).await];
    let mut rows: Vec<Row> = Vec::new();
    let mut marks = vec![granted()];

    // The peer's acquire alone: lease grant + lock, left held (distinct names).
    let acquired = {
        let (client, prefix) = (client.clone(), lock_prefix.clone());
        measure((0..OPS).collect(), move |i: usize| {
            let (client, name) = (client.clone(), format!("{prefix}/held/{i}"));
            async move { acquire(&client, name).await }
        })
        .await
    };
    assert_unique_keys(&acquired.results);
    rows.push(Row::new(
        "etcd lock: acquire only (lease grant + lock)",
        OPS,
        acquired.wall,
        acquired.latencies,
    ));
    marks.push(granted());
    slices.push(peer_slice(slices.len()).await);

    // 1. claim: one run per call, each run claimed once.
    let claimed = {
        let (store, worker) = (Arc::clone(&store), worker.clone());
        measure(runs.clone(), move |run| {
            let (store, worker) = (Arc::clone(&store), worker.clone());
            async move { store.claim(&run, &worker, ttl).await }
        })
        .await
    };
    let mut leases: Vec<Lease> = Vec::with_capacity(OPS);
    for result in claimed.results {
        let lease = result.unwrap_or_else(|e| panic!("claim: {e}"));
        assert_eq!(lease.fence().get(), 1, "{} claimed at fence 1", lease.run());
        leases.push(lease);
    }
    rows.push(Row::new(
        "claim (one run per call)",
        OPS,
        claimed.wall,
        claimed.latencies,
    ));
    marks.push(granted());
    slices.push(peer_slice(slices.len()).await);
    check_held(&*store, &runs, &worker, 0).await;

    // 2. renew: each lease once.
    let renewed = {
        let store = Arc::clone(&store);
        measure(leases, move |lease| {
            let store = Arc::clone(&store);
            async move { store.renew(&lease).await }
        })
        .await
    };
    for result in &renewed.results {
        let lease = result.as_ref().unwrap_or_else(|e| panic!("renew: {e}"));
        assert_eq!(lease.fence().get(), 1, "{} renewed at fence 1", lease.run());
    }
    rows.push(Row::new(
        "renew (one lease per call)",
        OPS,
        renewed.wall,
        renewed.latencies,
    ));
    marks.push(granted());
    slices.push(peer_slice(slices.len()).await);
    check_held(&*store, &runs, &worker, 1).await;

    // 3. claim_next: the tasks take from one backlog, each call up to CLAIM_NEXT_MAX leases.
    let nexts = {
        let queue = Arc::clone(&queue);
        measure((0..CLAIM_NEXT_CALLS).collect(), move |i: usize| {
            let queue = Arc::clone(&queue);
            let worker = WorkerId::new(format!("w{}", i % TASKS)).expect("worker id");
            async move { queue.claim_next(&worker, ttl, CLAIM_NEXT_MAX).await }
        })
        .await
    };
    let mut handed: Vec<Lease> = Vec::new();
    let (mut short_calls, mut empty_calls) = (0, 0);
    for result in nexts.results {
        let got = result.unwrap_or_else(|e| panic!("claim_next: {e}"));
        if got.len() < CLAIM_NEXT_MAX {
            short_calls += 1;
        }
        if got.is_empty() {
            empty_calls += 1;
        }
        for lease in &got {
            assert_eq!(
                lease.fence().get(),
                1,
                "{} handed out at fence 1",
                lease.run()
            );
        }
        handed.extend(got);
    }
    let distinct: HashSet<&RunId> = handed.iter().map(Lease::run).collect();
    assert_eq!(distinct.len(), handed.len(), "a run was handed out twice");
    assert!(!handed.is_empty(), "claim_next handed out nothing");
    rows.push(Row::new(
        &format!("claim_next(max {CLAIM_NEXT_MAX}): leases/s, p50/p99 per call"),
        handed.len(),
        nexts.wall,
        nexts.latencies,
    ));
    marks.push(granted());
    slices.push(peer_slice(slices.len()).await);

    // 4. end_many: every lease claim_next handed out completed, END_BATCH per call.
    let ended_leases = handed.len() / END_BATCH * END_BATCH;
    let batches: Vec<Vec<Ending>> = handed[..ended_leases]
        .chunks(END_BATCH)
        .map(|chunk| {
            chunk
                .iter()
                .map(|lease| Ending::new(lease.clone(), End::Complete))
                .collect()
        })
        .collect();
    let ended = {
        let queue = Arc::clone(&queue);
        measure(batches, move |batch: Vec<Ending>| {
            let queue = Arc::clone(&queue);
            async move { (batch.len(), queue.end_many(&batch).await) }
        })
        .await
    };
    for (len, result) in ended.results {
        let items = result.unwrap_or_else(|e| panic!("end_many: {e}"));
        assert_eq!(items.len(), len, "end_many answered every item");
        for item in items {
            item.unwrap_or_else(|e| panic!("an end_many item: {e}"));
        }
    }
    rows.push(Row::new(
        &format!("end_many({END_BATCH} completes): leases/s, p50/p99 per call"),
        ended_leases,
        ended.wall,
        ended.latencies,
    ));
    marks.push(granted());
    slices.push(peer_slice(slices.len()).await);
    let counts = queue.count().await.expect("count");
    assert_eq!(counts.completed, ended_leases as u64, "completed runs");
    assert_eq!(
        counts.held,
        (handed.len() - ended_leases) as u64,
        "held runs"
    );

    // Every lock call of every slice got its own key.
    let keys: Vec<String> = slices
        .iter()
        .flat_map(|slice| slice.results.iter().cloned())
        .collect();
    assert_unique_keys(&keys);
    assert_eq!(keys.len(), slices.len() * PEER_SLICE);

    // The peer's row is all its slices; row k's base is slices k and k + 1.
    let peer = join(
        "etcd lock: acquire + release (lease grant + lock + unlock), all slices",
        &slices,
    );
    println!();
    println!(
        "etcd 3.4, {MEMBERS} members on 127.0.0.1 (fixture: heartbeat 50 ms, election 500 ms; \
         member {leader} led), {TASKS} concurrent tasks per row (library and peer alike), TTL \
         {TTL_SECS} s; the library's client calls member 0 (it fails over to the next on \
         error), the peer's client (lease_etcd::rpc) balances over all {MEMBERS}"
    );
    println!(
        "ratios against the peer's acquire + release measured right before and after the row \
         ({PEER_SLICE} cycles each side; ops/s ratio > 1: more per second; p99 ratio > 1: \
         slower call)"
    );
    println!();
    println!(
        "| row | items | calls | ops/s | p50 ms | p99 ms | ops/s ratio | p99 ratio | etcd leases granted |"
    );
    println!("|---|--:|--:|--:|--:|--:|--:|--:|--:|");
    let line = |row: &Row, base: &Row, grants: u64| {
        let p99 = row.percentile_ms(0.99);
        println!(
            "| {} | {} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {} ({:.3} per item) |",
            row.name,
            row.items,
            row.calls,
            row.per_second(),
            row.percentile_ms(0.50),
            p99,
            row.per_second() / base.per_second(),
            p99 / base.percentile_ms(0.99),
            grants,
            grants as f64 / row.items as f64,
        );
    };
    // The peer grants one lease per acquire.
    line(&peer, &peer, peer.items as u64);
    for (k, row) in rows.iter().enumerate() {
        let grants = if row.name.starts_with("etcd lock") {
            row.items as u64
        } else {
            marks[k + 1] - marks[k]
        };
        line(row, &join("", &slices[k..k + 2]), grants);
    }
    println!();
    let rates: Vec<String> = slices
        .iter()
        .map(|slice| format!("{:.0}", PEER_SLICE as f64 / slice.wall.as_secs_f64()))
        .collect();
    println!(
        "peer acquire + release slices, in order: {} ops/s; claim_next calls that got fewer \
         than {CLAIM_NEXT_MAX}: {short_calls} of {CLAIM_NEXT_CALLS} ({empty_calls} empty, with \
         {} runs still runnable after the row); whole test {:.1} s; load average at start \
         {load_at_start}, at end {}",
        rates.join(", "),
        backlog - handed.len(),
        started.elapsed().as_secs_f64(),
        load_average(),
    );
    drop(cluster);
}

/// The peer slices as one row: their cycles, summed wall time and every latency.
fn join(name: &str, slices: &[Measured<String>]) -> Row {
    let latencies: Vec<Duration> = slices
        .iter()
        .flat_map(|slice| slice.latencies.iter().copied())
        .collect();
    let wall = slices.iter().map(|slice| slice.wall).sum();
    Row::new(name, latencies.len(), wall, latencies)
}
