//! Whole-system tests: real `lease-test-worker worker` processes, one database, a real network partition.
//!
//! Every test has `leases` in its name:
//! `cargo test -p distribution leases -- --test-threads=1`. Each scenario runs on Postgres and
//! on Redis, against private servers started here (the partition cuts one loopback address off,
//! so these tests never reuse `DATABASE_URL`/`REDIS_URL`). Expiry uses short real TTLs: worker
//! processes run on the real clock, which `tokio::time::pause` cannot reach.

mod support;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use distribution::{connect, Config, LeaseStore, RunId, RunState};
use serde_json::Value;
use support::partition::{Partition, A_HOST, B_HOST};
use support::servers::{Kind, Server};
use support::worker::{test_worker_bin, Worker};

const SECS: fn(u64) -> Duration = Duration::from_secs;

fn fence(event: &Value) -> u64 {
    event["fence"]
        .as_u64()
        .unwrap_or_else(|| panic!("no fence in {event}"))
}

fn at(event: &Value) -> u64 {
    event["at_us"]
        .as_u64()
        .unwrap_or_else(|| panic!("no instant in {event}"))
}

/// The test's own view of the store, through B's address.
async fn admin(server: &Server, namespace: &str) -> Arc<dyn LeaseStore> {
    let config = Config::default()
        .with_store(server.url_via(B_HOST))
        .with_namespace(namespace);
    connect(&config).await.expect("admin connection")
}

/// The reference worker's ledger for `run`, read with `lease-test-worker ledger --json`.
fn ledger(server: &Server, namespace: &str, run: &str) -> Vec<Value> {
    let out = Command::new(test_worker_bin())
        .args(["--store", &server.url_via(B_HOST), "--namespace", namespace])
        .args(["ledger", run, "--json"])
        .output()
        .expect("run lease-test-worker ledger");
    assert!(
        out.status.success(),
        "lease-test-worker ledger failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("ledger JSON")
}

/// The outcome of A's next write: whatever the store said, so a wrongly accepted write fails
/// the test at once instead of after a timeout.
async fn next_write_outcome(worker: &mut Worker, within: Duration) -> Value {
    worker
        .expect_one_of(
            &["write_rejected", "write_accepted", "write_failed"],
            within,
        )
        .await
}

fn assert_stale(event: &Value, presented: u64, current: u64) {
    assert_eq!(
        event["event"], "write_rejected",
        "the stale write must be refused: {event}"
    );
    assert_eq!(event["reason"], "stale_fence", "rejected by fence: {event}");
    assert_eq!(
        (event["presented"].as_u64(), event["current"].as_u64()),
        (Some(presented), Some(current)),
        "{event}"
    );
}

/// Starts worker A on `run` (creating it), and waits until it holds fence 1 and has sent a
/// heartbeat: A is executing.
async fn start_a(
    url: &str,
    namespace: &str,
    run: &str,
    ttl: u64,
    heartbeat: Option<u64>,
) -> Worker {
    let mut a = Worker::spawn(
        "A",
        url,
        namespace,
        ttl,
        heartbeat,
        &[
            "--id",
            "worker-a",
            "--run",
            run,
            "--create",
            "--metrics",
            "127.0.0.1:0",
        ],
    );
    assert_eq!(fence(&a.expect("claimed", SECS(30)).await), 1);
    a.expect("heartbeat", SECS(5)).await;
    a
}

/// Starts worker B, which keeps trying to claim `run` and takes it the moment the store allows
/// (when A's lease expires on the store's clock).
fn spawn_b(server: &Server, namespace: &str, run: &str, ttl: u64) -> Worker {
    Worker::spawn(
        "B",
        &server.url_via(B_HOST),
        namespace,
        ttl,
        None,
        &["--id", "worker-b", "--run", run, "--wait-ms", "20000"],
    )
}

/// Scrapes a worker's `--metrics` endpoint over HTTP (its address from the worker's `metrics`
/// event) and returns the Prometheus text.
fn scrape(worker: &Worker) -> String {
    use std::io::{Read, Write};
    let addr = worker
        .seen
        .iter()
        .find(|e| e["event"] == "metrics")
        .and_then(|e| e["addr"].as_str())
        .unwrap_or_else(|| panic!("worker {} announced no metrics address", worker.name))
        .to_string();
    let mut conn = std::net::TcpStream::connect(&addr).expect("connect to the metrics endpoint");
    conn.set_read_timeout(Some(SECS(10))).unwrap();
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: worker\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    conn.read_to_string(&mut response).expect("read the scrape");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response
}

/// The value of the Prometheus sample `series` (name with its labels, as printed), or 0 when
/// the series is absent.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == series).then(|| value.parse().expect("a number"))
        })
        .unwrap_or(0.0)
}

/// Worker B waits for A's lease to expire, reclaims `run` under fence 2 and charges the card
/// under it; returns B, still holding the run, and its `claimed` event.
async fn reclaim_and_charge_as_b(
    server: &Server,
    namespace: &str,
    run: &str,
    ttl: u64,
) -> (Worker, Value) {
    let b = spawn_b(server, namespace, run, ttl);
    charge_as_b(b).await
}

/// B, already started, reclaims under fence 2 and charges the card; returns B, still holding
/// the run, and its `claimed` event.
async fn charge_as_b(mut b: Worker) -> (Worker, Value) {
    let claimed = b.expect("claimed", SECS(30)).await;
    assert_eq!(fence(&claimed), 2, "B reclaims under the next fence");
    b.send("step charge-card").await;
    let accepted = b.expect("write_accepted", SECS(10)).await;
    assert_eq!(fence(&accepted), 2);
    (b, claimed)
}

/// After SIGCONT a woken A reports two things in either order: its scope's cancellation (its
/// deadline passed while it was frozen) and the outcome of the write it had in flight. Returns
/// both, as (cancelled, outcome).
async fn cancel_and_write_outcome(a: &mut Worker) -> (Value, Value) {
    let (mut cancelled, mut late) = (None, None);
    while cancelled.is_none() || late.is_none() {
        let event = a
            .expect_one_of(
                &[
                    "cancelled",
                    "write_rejected",
                    "write_accepted",
                    "write_failed",
                ],
                SECS(30),
            )
            .await;
        if event["event"] == "cancelled" {
            cancelled = Some(event);
        } else {
            late = Some(event);
        }
    }
    (cancelled.expect("seen"), late.expect("seen"))
}

/// The run's side effect happened exactly once: the ledger holds B's charge under fence 2 only.
fn assert_charged_once_by_b(server: &Server, namespace: &str, run: &str) {
    let entries = ledger(server, namespace, run);
    assert_eq!(entries.len(), 1, "exactly one effect: {entries:#?}");
    assert_eq!(
        (
            &entries[0]["effect"],
            entries[0]["fence"].as_u64(),
            &entries[0]["worker"]
        ),
        (
            &Value::from("charge-card"),
            Some(2),
            &Value::from("worker-b")
        )
    );
}

/// A is partitioned mid-run with a write in flight; its scope cancels at its local deadline;
/// B reclaims under fence 2 and performs the effect; after the heal (B still holding the run),
/// A's in-flight and new writes are rejected with StaleFence { presented: 1, current: 2 }; B
/// completes, and the ledger holds B's effect only.
async fn partitioned_worker_is_fenced_out(kind: Kind) {
    let Some(server) = Server::start(kind) else {
        return;
    };
    let ns = server.namespace("partition");
    let run = "order-partitioned";
    let ttl = 1_500;
    let mut partition = Partition::prepare(server.port()).await;

    let mut a = start_a(
        &partition.a_url(&server.url_via(A_HOST)),
        &ns,
        run,
        ttl,
        None,
    )
    .await;

    partition.cut();
    // B starts at the cut and claims the moment the store allows: the order of A's cancel and
    // B's claim below is measured, not arranged.
    let b = spawn_b(&server, &ns, run, ttl);
    a.send("step charge-card").await; // in flight as the partition begins
    a.expect("write_sent", SECS(5)).await;

    let cancelled = a.expect("cancelled", SECS(10)).await;
    assert_eq!(
        cancelled["cancel"], "deadline",
        "A stopped on its local deadline: {cancelled}"
    );

    let (mut b, claimed_b) = charge_as_b(b).await;
    assert!(
        at(&cancelled) < at(&claimed_b),
        "A's scope must be cancelled before B's claim: cancelled at {} us, B claimed at {} us",
        at(&cancelled),
        at(&claimed_b)
    );
    eprintln!(
        "A stopped {} ms before B claimed",
        (at(&claimed_b) - at(&cancelled)) / 1_000
    );

    // Heal while B still holds the run, so only the fence comparison can refuse A.
    partition.heal();
    let late = next_write_outcome(&mut a, SECS(90)).await;
    assert_eq!(late["effect"], "charge-card");
    assert_stale(&late, 1, 2);
    a.send("step charge-card-again").await;
    let again = next_write_outcome(&mut a, SECS(30)).await;
    assert_stale(&again, 1, 2);
    // The operator's view of the same events, scraped from A over HTTP: two stale writes
    // refused (double executions that did not happen) and one scope cancelled by its deadline.
    let scraped = scrape(&a);
    assert_eq!(
        sample(&scraped, "lease_stale_writes_refused_total"),
        2.0,
        "{scraped}"
    );
    assert_eq!(
        sample(
            &scraped,
            "lease_scope_cancellations_total{reason=\"deadline\"}"
        ),
        1.0,
        "{scraped}"
    );
    eprintln!(
        "scraped from A:\n{}",
        scraped
            .lines()
            .filter(|l| l.starts_with("lease_stale") || l.starts_with("lease_scope"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    b.send("complete").await;
    b.expect("completed", SECS(10)).await;
    let a_events = a.finish().await;
    b.finish().await;
    assert!(
        !a_events.iter().any(|e| e["event"] == "write_accepted"),
        "no write of A was accepted: {a_events:#?}"
    );

    assert_charged_once_by_b(&server, &ns, run);
    let record = admin(&server, &ns)
        .await
        .inspect(&RunId::new(run).unwrap())
        .await
        .unwrap();
    assert_eq!((record.state, record.fence.get()), (RunState::Completed, 2));
}

/// A is SIGSTOPped mid-step past its TTL; B reclaims and performs the effect; on SIGCONT (B still
/// holding the run) A's scope cancels on its local deadline and its delayed write is rejected
/// by fence; B completes, and the ledger holds one effect.
async fn paused_worker_is_fenced_out(kind: Kind) {
    let Some(server) = Server::start(kind) else {
        return;
    };
    let ns = server.namespace("pause");
    let run = "order-paused";
    let ttl = 1_000;
    let mut a = start_a(&server.url_via(A_HOST), &ns, run, ttl, None).await;
    a.send("step-after 300 charge-card").await; // decided under fence 1, written later
    a.expect("step_planned", SECS(5)).await;
    a.signal("STOP");
    // B starts at the pause. A frozen process cannot stop itself, so here the fence alone
    // must refuse A's write when it wakes.
    let (mut b, _) = reclaim_and_charge_as_b(&server, &ns, run, ttl).await;

    // Resume A while B still holds the run, so only the fence comparison can refuse A.
    a.signal("CONT");
    // On waking, A's expired deadline and its delayed write race: the write was already in
    // flight, which is exactly what the fence is for. Take both events, in either order.
    let (cancelled, late) = cancel_and_write_outcome(&mut a).await;
    assert_eq!(cancelled["cancel"], "deadline", "{cancelled}");
    assert_stale(&late, 1, 2);
    b.send("complete").await;
    b.expect("completed", SECS(10)).await;
    a.finish().await;
    b.finish().await;
    assert_charged_once_by_b(&server, &ns, run);
}

/// Postgres only: A is SIGSTOPped *inside* a fenced transaction, its effect written and the run's
/// row locked. The server aborts the idle transaction on its own once its bound passes; B,
/// started at the cut with --wait-ms, reclaims within A's TTL plus that bound; after SIGCONT A's
/// commit fails (never accepted) and the ledger holds B's effect alone.
async fn worker_stopped_inside_a_fenced_transaction_is_fenced_out() {
    use distribution::postgres::sqlx;
    let Some(server) = Server::start(Kind::Postgres) else {
        return;
    };
    let ns = server.namespace("txstop");
    let run = "order-stopped-in-tx";
    let ttl = 1_000;
    let mut a = start_a(&server.url_via(A_HOST), &ns, run, ttl, None).await;
    a.send("tx-step 500 charge-card").await; // commits 500 ms later, unless stopped first
    let open = a.expect("tx_open", SECS(5)).await;
    a.signal("STOP"); // frozen with the row locked and the effect written, uncommitted
    assert_eq!(fence(&open), 1);
    let bound = open["bound_ms"]
        .as_u64()
        .unwrap_or_else(|| panic!("no bound in {open}"));
    assert!(
        (1..=ttl).contains(&bound) || bound == 250,
        "the bound is A's time left on its lease (or the floor): {open}"
    );

    // B starts at the cut and claims as soon as the store allows.
    let (mut b, claimed_b) = reclaim_and_charge_as_b(&server, &ns, run, ttl).await;
    let waited_ms = (at(&claimed_b) - at(&open)) / 1_000;
    assert!(
        waited_ms <= ttl + bound + 1_500,
        "B reclaimed {waited_ms} ms after A froze, beyond TTL {ttl} + bound {bound} (+1.5 s)"
    );
    // The server ended A's transaction by itself: no session of A is left inside one.
    let pool = sqlx::PgPool::connect(&server.url_via(B_HOST))
        .await
        .unwrap();
    let a_in_tx: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE client_addr = '127.0.0.2' AND state LIKE 'idle in transaction%'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        a_in_tx, 0,
        "A's frozen transaction was aborted by the server"
    );
    pool.close().await;

    a.signal("CONT");
    // A's commit fails; its scope also meets its expired deadline. Take both, in either order.
    let (_, late) = cancel_and_write_outcome(&mut a).await;
    eprintln!("A after SIGCONT: {late}; B claimed {waited_ms} ms after A froze (bound {bound} ms)");
    assert_eq!(late["effect"], "charge-card");
    assert_ne!(
        late["event"], "write_accepted",
        "A's commit must fail after the server aborted its transaction: {late}"
    );
    if late["event"] == "write_failed" {
        assert_eq!(late["retryable"], true, "{late}");
    } else {
        assert_stale(&late, 1, 2);
    }
    b.send("complete").await;
    b.expect("completed", SECS(10)).await;
    a.finish().await;
    b.finish().await;
    assert_charged_once_by_b(&server, &ns, run);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_worker_stopped_inside_a_fenced_transaction_is_fenced_out_on_postgres() {
    worker_stopped_inside_a_fenced_transaction_is_fenced_out().await;
}

/// A suspends its run: the owner is cleared and the store's heartbeat counter stays still over
/// more than three heartbeat intervals; after resume, B's claim takes a higher fence.
async fn suspended_run_stops_heartbeats(kind: Kind) {
    let Some(server) = Server::start(kind) else {
        return;
    };
    let ns = server.namespace("suspend");
    let run = RunId::new("order-suspended").unwrap();
    let heartbeat = 100;
    let mut a = start_a(
        &server.url_via(A_HOST),
        &ns,
        run.as_str(),
        600,
        Some(heartbeat),
    )
    .await;
    a.expect("heartbeat", SECS(5)).await;
    a.send("suspend").await;
    a.expect("suspended", SECS(10)).await;

    let store = admin(&server, &ns).await;
    let before = store.inspect(&run).await.unwrap();
    assert_eq!(
        (before.state, before.owner.clone()),
        (RunState::Suspended, None)
    );
    assert!(
        before.heartbeats >= 2,
        "heartbeats reached the store: {before:?}"
    );
    tokio::time::sleep(Duration::from_millis(heartbeat * 5)).await;
    let after = store.inspect(&run).await.unwrap();
    assert_eq!(
        after.heartbeats, before.heartbeats,
        "no heartbeat while suspended"
    );
    assert_eq!(after.state, RunState::Suspended);
    a.finish().await;

    store.resume(&run).await.unwrap();
    let mut b = Worker::spawn(
        "B",
        &server.url_via(B_HOST),
        &ns,
        600,
        None,
        &["--id", "worker-b", "--run", run.as_str()],
    );
    assert_eq!(
        fence(&b.expect("claimed", SECS(30)).await),
        2,
        "a higher fence after resume"
    );
    b.finish().await;
}

/// 100 claim/expire cycles by two worker processes alternating: fences 1..=100, strictly
/// increasing, never repeated.
async fn fences_increase_over_a_hundred_process_cycles(kind: Kind) {
    let Some(server) = Server::start(kind) else {
        return;
    };
    let ns = server.namespace("cycles");
    let run = "order-cycles";
    let mut fences = Vec::new();
    for cycle in 0..100u64 {
        let (id, host) = if cycle % 2 == 0 {
            ("worker-a", A_HOST)
        } else {
            ("worker-b", B_HOST)
        };
        let mut w = Worker::spawn(
            if cycle % 2 == 0 { "A" } else { "B" },
            &server.url_via(host),
            &ns,
            100,
            None,
            &["--id", id, "--run", run, "--create", "--wait-ms", "10000"],
        );
        let claimed = w.expect("claimed", SECS(30)).await;
        assert_eq!(claimed["worker"], id);
        fences.push(fence(&claimed));
        // Exiting drops the scope without releasing: the next worker waits for expiry.
        w.send("exit").await;
        w.finish().await;
    }
    assert_eq!(fences, (1..=100).collect::<Vec<_>>());
}

/// Creates `n` runs named `{prefix}-NNNNN` through the library's bulk create.
async fn backlog(store: &Arc<dyn LeaseStore>, prefix: &str, n: usize) -> Vec<RunId> {
    let ids: Vec<RunId> = (0..n)
        .map(|i| RunId::new(format!("{prefix}-{i:05}")).expect("valid id"))
        .collect();
    for chunk in ids.chunks(distribution::MAX_BATCH) {
        let created = store.create_many(chunk).await.expect("create_many");
        assert!(created.iter().all(Result::is_ok), "{created:?}");
    }
    ids
}

/// A pool worker (`lease-test-worker worker --pool`, the library's `Worker`) killed with SIGKILL between
/// batch commits never reported an end that the store does not hold: every run it printed as
/// `ended` is completed in the store under the printed fence, with its effect written once in
/// the same commit. The store may hold more completions than were printed (committed, then
/// killed before printing), never fewer.
async fn pool_worker_killed_between_flushes_reported_only_committed_ends(kind: Kind) {
    let Some(server) = Server::start(kind) else {
        return;
    };
    let namespace = server.namespace("pool_kill");
    let store = admin(&server, &namespace).await;
    backlog(&store, "job", 4_000).await;
    let mut pool = Worker::spawn(
        "pool",
        &server.url_via(B_HOST),
        &namespace,
        30_000,
        None,
        &[
            "--id",
            "pool-a",
            "--pool",
            "16",
            "--batch",
            "64",
            "--batch-delay-ms",
            "20",
            "--job-ms",
            "3",
        ],
    );
    pool.expect("pool_started", SECS(30)).await;
    let mut ended = 0;
    while ended < 300 {
        let event = pool.expect_one_of(&["ended", "end_failed"], SECS(30)).await;
        assert_eq!(event["event"], "ended", "{event}");
        ended += 1;
    }
    let events = pool.kill().await;
    let reported: Vec<&Value> = events.iter().filter(|e| e["event"] == "ended").collect();
    assert!(reported.len() >= 300);
    for event in &reported {
        let run = RunId::new(event["run"].as_str().expect("run")).unwrap();
        let record = store.inspect(&run).await.unwrap();
        assert_eq!(
            (record.state, record.fence.get()),
            (RunState::Completed, fence(event)),
            "{run} was reported ended: {event}"
        );
        let journal = store.journal(&run).await.unwrap();
        assert_eq!(journal.len(), 1, "{run}: one effect");
        assert_eq!(journal[0].payload, format!("pool-a did {run}").into_bytes());
        assert_eq!(journal[0].fence.get(), fence(event));
    }
    let mut completed = 0;
    let mut after = None;
    loop {
        let page = store
            .list(
                &distribution::ListFilter::new()
                    .with_state(Some(RunState::Completed))
                    .with_after(after.clone())
                    .with_limit(1_000),
            )
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        after = Some(last.run.clone());
        for record in &page {
            assert_eq!(
                store.journal(&record.run).await.unwrap().len(),
                1,
                "{}: completed without its effect",
                record.run
            );
        }
        completed += page.len();
    }
    assert!(
        completed >= reported.len(),
        "the store holds {completed} completions, fewer than the {} reported",
        reported.len()
    );
}

/// A pool worker stopped with SIGTERM stops claiming, gives its running jobs the grace period,
/// then releases their runs: the store shows them runnable and unowned at once (long before
/// the TTL), and the next claim takes each under fence 2.
async fn pool_worker_stopped_by_sigterm_releases_its_runs(kind: Kind) {
    let Some(server) = Server::start(kind) else {
        return;
    };
    let namespace = server.namespace("pool_term");
    let store = admin(&server, &namespace).await;
    let ids = backlog(&store, "slow", 4).await;
    let mut pool = Worker::spawn(
        "pool",
        &server.url_via(B_HOST),
        &namespace,
        60_000,
        None,
        &[
            "--id",
            "pool-a",
            "--pool",
            "4",
            "--job-ms",
            "600000",
            "--grace-ms",
            "300",
        ],
    );
    pool.expect("pool_started", SECS(30)).await;
    let give_up = tokio::time::Instant::now() + SECS(30);
    loop {
        let mut held = 0;
        for id in &ids {
            held += store.inspect(id).await.unwrap().owner.is_some() as usize;
        }
        if held == ids.len() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "the pool never held its 4 runs"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    pool.signal("TERM");
    let stopped = pool.expect("stopped", SECS(30)).await;
    assert_eq!(
        (stopped["released"].as_u64(), stopped["completed"].as_u64()),
        (Some(4), Some(0)),
        "{stopped}"
    );
    let events = pool.finish().await;
    let released: Vec<&Value> = events
        .iter()
        .filter(|e| e["event"] == "ended" && e["end"] == "release")
        .collect();
    assert_eq!(released.len(), 4, "{events:#?}");
    for id in &ids {
        let record = store.inspect(id).await.unwrap();
        assert_eq!(record.state, RunState::Runnable);
        assert!(record.owner.is_none(), "{id} still held after the shutdown");
    }
    let next = store
        .claim_next(
            &distribution::WorkerId::new("pool-b").unwrap(),
            distribution::Ttl::from_secs(30).unwrap(),
            10,
        )
        .await
        .unwrap();
    assert_eq!(next.len(), 4, "every released run is claimable at once");
    assert!(next.iter().all(|l| l.fence().get() == 2));
}

macro_rules! on_both_backends {
    ($($scenario:ident => $pg:ident, $redis:ident;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $pg() {
            $scenario(Kind::Postgres).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $redis() {
            $scenario(Kind::Redis).await;
        }
    )*};
}

on_both_backends! {
    partitioned_worker_is_fenced_out =>
        leases_partitioned_worker_is_fenced_out_on_postgres,
        leases_partitioned_worker_is_fenced_out_on_redis;
    paused_worker_is_fenced_out =>
        leases_paused_worker_is_fenced_out_on_postgres,
        leases_paused_worker_is_fenced_out_on_redis;
    suspended_run_stops_heartbeats =>
        leases_suspended_run_stops_heartbeats_on_postgres,
        leases_suspended_run_stops_heartbeats_on_redis;
    fences_increase_over_a_hundred_process_cycles =>
        leases_fences_increase_over_a_hundred_process_cycles_on_postgres,
        leases_fences_increase_over_a_hundred_process_cycles_on_redis;
    pool_worker_killed_between_flushes_reported_only_committed_ends =>
        leases_pool_worker_killed_between_flushes_reported_only_committed_ends_on_postgres,
        leases_pool_worker_killed_between_flushes_reported_only_committed_ends_on_redis;
    pool_worker_stopped_by_sigterm_releases_its_runs =>
        leases_pool_worker_stopped_by_sigterm_releases_its_runs_on_postgres,
        leases_pool_worker_stopped_by_sigterm_releases_its_runs_on_redis;
}
