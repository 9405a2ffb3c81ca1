//! Exactly-once effects in the user's own store, under crashes: worker processes run jobs
//! whose effect is one row in the user's table `payments(run_id, fence)` (on Redis one entry in
//! the run's own list), and a driver SIGKILLs them at random points — before, inside and after
//! the transaction or script that writes the effect — and starts them again, at least 200
//! times, until every run is completed. Then:
//!
//! - **one transaction** (Postgres: the effect, `fence_in` and `end_in` in the caller's
//!   transaction; Redis: one fenced script that writes the effect and completes the run):
//!   exactly one row per run, under the fence its completion was written under;
//! - **group-committed** (Postgres: the effect handed to the Worker as a `PgEffect`, run in a
//!   savepoint of the batch transaction that completes the run with others): exactly one row
//!   per run, under its completion's fence, as for one transaction;
//! - **two commits** (the effect in a fenced transaction or fenced script, the completion
//!   after it, as before this existed): the same schedule leaves runs with two rows, and the
//!   test asserts it sees some, so it is known to detect a double effect.
//!
//! It prints one line per backend:
//! `exactly-once: <backend> runs=<R> kills=<K> one-transaction: max rows per run <M>; two
//! commits: runs with two rows <D>`.
//!
//! The worker processes are this test binary itself, run again on the ignored test
//! `exactly_once_worker_child` with `LEASE_EO_*` variables saying what to do; without them that
//! test does nothing.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use distribution::postgres::{sqlx, PgEffect, PostgresConfig, PostgresLeaseStore};
use distribution::redis::{FencedScript, RedisConfig, RedisLeaseStore};
use distribution::{
    CancellationToken, End, Ended, LeaseStore, RunContext, RunId, RunState, Ttl, Worker,
    WorkerConfig, WorkerId,
};
use lease_conformance::fixtures::{
    required, unavailable, unique_namespace, PgBouncer, PostgresServer, RedisServer, PGBOUNCER_HINT,
};

const PG_HINT: &str = "install postgresql (bash scripts/test.sh does it)";

/// Runs each schedule starts with; more are added while fewer than [`MIN_KILLS`] kills ran.
const RUNS: usize = 200;
const MIN_KILLS: usize = 200;
/// Worker processes alive at once.
const CHILDREN: usize = 3;
const TTL_MS: u64 = 600;

/// A small deterministic generator, seeded from the clock (the seed is printed).
struct Rng(u64);

impl Rng {
    fn seeded() -> Rng {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        Rng(nanos | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A pause of up to `ms` milliseconds, drawn afresh each time.
async fn jitter(ms: u64) {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(nanos % ms.max(1))).await;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Postgres,
    Redis,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// The effect and the completion in one transaction (or one script).
    One,
    /// The effect in the Worker's batch transaction, with the completion (Postgres).
    Batch,
    /// The effect, then the completion: two commits.
    Two,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::One => "one",
            Mode::Batch => "batch",
            Mode::Two => "two",
        }
    }
}

/// The worker process: runs the jobs of one schedule until it is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a worker process of it_exactly_once's schedules, started by them"]
async fn exactly_once_worker_child() {
    let (Ok(backend), Ok(mode), Ok(url), Ok(ns), Ok(id)) = (
        std::env::var("LEASE_EO_BACKEND"),
        std::env::var("LEASE_EO_MODE"),
        std::env::var("LEASE_EO_URL"),
        std::env::var("LEASE_EO_NS"),
        std::env::var("LEASE_EO_WORKER"),
    ) else {
        return; // run by hand: not a child
    };
    let one = mode == "one";
    let batch = mode == "batch";
    let config = WorkerConfig::new(Ttl::from_millis(TTL_MS).unwrap())
        .with_concurrency(4)
        .with_poll_interval(Duration::from_millis(10))
        .with_batch(16, Duration::from_millis(2))
        .with_grace(Duration::from_millis(100));
    let worker_id = WorkerId::new(id).unwrap();
    let never = CancellationToken::new();
    if backend == "postgres" {
        let store = std::sync::Arc::new(
            PostgresLeaseStore::connect(
                PostgresConfig::from_url(url)
                    .with_schema(&ns)
                    .with_migrations(false)
                    .with_max_connections(6),
            )
            .await
            .expect("the child connects"),
        );
        let insert = format!("INSERT INTO \"{ns}\".payments (run_id, fence) VALUES ($1, $2)");
        let worker = Worker::new(store.clone(), worker_id, config).unwrap();
        let handler = move |ctx: RunContext| {
            let (store, insert) = (store.clone(), insert.clone());
            async move {
                let lease = ctx.lease();
                jitter(30).await;
                if batch {
                    let fence = lease.fence().get() as i64;
                    ctx.set_effect(PgEffect::statement(
                        &*insert,
                        [lease.run().as_str().into(), fence.into()],
                    ))?;
                    jitter(20).await;
                    Ok(End::Complete)
                } else if one {
                    let mut tx = store.pool().begin().await?;
                    store.fence_in(&mut tx, &lease).await?;
                    // Unnamed: the same statement works behind a transaction pooler.
                    sqlx::query(&insert)
                        .persistent(false)
                        .bind(lease.run().as_str())
                        .bind(lease.fence().get() as i64)
                        .execute(&mut *tx)
                        .await?;
                    jitter(20).await;
                    store.end_in(&mut tx, &lease, End::Complete).await?;
                    tx.commit().await?;
                    Ok(End::Committed(Ended::Completed))
                } else {
                    let mut tx = store.fenced_transaction(&lease).await?;
                    sqlx::query(&insert)
                        .persistent(false)
                        .bind(lease.run().as_str())
                        .bind(lease.fence().get() as i64)
                        .execute(&mut *tx)
                        .await?;
                    jitter(20).await;
                    tx.commit().await?;
                    jitter(30).await; // between the two commits
                    Ok(End::Complete)
                }
            }
        };
        let _ = worker.run(handler, never).await;
    } else {
        let store = std::sync::Arc::new(
            RedisLeaseStore::connect(RedisConfig::from_url(url).with_namespace(&ns))
                .await
                .expect("the child connects"),
        );
        let push = std::sync::Arc::new(FencedScript::new(
            "return redis.call('RPUSH', KEYS[1], ARGV[1])",
        ));
        let worker = Worker::new(store.clone(), worker_id, config).unwrap();
        let handler = move |ctx: RunContext| {
            let (store, push) = (store.clone(), push.clone());
            async move {
                let lease = ctx.lease();
                let key = store.script_key(lease.run(), "payments");
                let fence = lease.fence().get().to_string();
                jitter(40).await;
                if one {
                    let _: i64 = store
                        .fenced_script_with_end(&lease, &push, &[&key], &[&fence], End::Complete)
                        .await?;
                    Ok(End::Committed(Ended::Completed))
                } else {
                    let _: i64 = store
                        .fenced_script(&lease, &push, &[&key], &[&fence])
                        .await?;
                    jitter(30).await; // between the two writes
                    Ok(End::Complete)
                }
            }
        };
        let _ = worker.run(handler, never).await;
    }
}

/// One started worker process.
struct Child {
    process: tokio::process::Child,
}

fn spawn(backend: Backend, mode: Mode, url: &str, ns: &str, n: usize) -> Child {
    let exe = std::env::current_exe().expect("the test binary");
    let process = tokio::process::Command::new(exe)
        .args([
            "--exact",
            "exactly_once_worker_child",
            "--ignored",
            "--test-threads=1",
        ])
        .env(
            "LEASE_EO_BACKEND",
            match backend {
                Backend::Postgres => "postgres",
                Backend::Redis => "redis",
            },
        )
        .env("LEASE_EO_MODE", mode.name())
        .env("LEASE_EO_URL", url)
        .env("LEASE_EO_NS", ns)
        .env("LEASE_EO_WORKER", format!("w{n}"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start a worker process");
    Child { process }
}

/// What a schedule left behind.
struct Outcome {
    runs: usize,
    kills: usize,
    /// Rows (or list entries) per run, and the fences they were written under.
    effects: HashMap<String, Vec<u64>>,
    /// Each run's fence in the store (that of its completion).
    completed_at: HashMap<String, u64>,
    took: Duration,
}

/// The store a schedule's driver uses, and how it reads the effects.
#[allow(clippy::large_enum_variant)] // one per schedule
enum Admin {
    Postgres(PostgresLeaseStore),
    Redis(RedisLeaseStore, redis::aio::MultiplexedConnection),
}

impl Admin {
    fn store(&self) -> &dyn LeaseStore {
        match self {
            Admin::Postgres(s) => s,
            Admin::Redis(s, _) => s,
        }
    }

    async fn completed(&mut self, runs: &[RunId]) -> usize {
        match self {
            Admin::Postgres(s) => {
                let n: i64 = sqlx::query_scalar(&format!(
                    "SELECT count(*) FROM \"{}\".runs WHERE state = 'completed'",
                    s.schema()
                ))
                .fetch_one(s.pool())
                .await
                .unwrap();
                n as usize
            }
            Admin::Redis(s, _) => {
                let mut done = 0;
                for run in runs {
                    if s.inspect(run).await.unwrap().state == RunState::Completed {
                        done += 1;
                    }
                }
                done
            }
        }
    }

    async fn effects(&mut self, runs: &[RunId]) -> HashMap<String, Vec<u64>> {
        let mut effects: HashMap<String, Vec<u64>> = HashMap::new();
        match self {
            Admin::Postgres(s) => {
                let rows: Vec<(String, i64)> = sqlx::query_as(&format!(
                    "SELECT run_id, fence FROM \"{}\".payments",
                    s.schema()
                ))
                .fetch_all(s.pool())
                .await
                .unwrap();
                for (run, fence) in rows {
                    effects.entry(run).or_default().push(fence as u64);
                }
            }
            Admin::Redis(s, conn) => {
                for run in runs {
                    let entries: Vec<u64> = redis::cmd("LRANGE")
                        .arg(s.script_key(run, "payments"))
                        .arg(0)
                        .arg(-1)
                        .query_async(conn)
                        .await
                        .unwrap();
                    if !entries.is_empty() {
                        effects.insert(run.to_string(), entries);
                    }
                }
            }
        }
        effects
    }
}

/// One schedule: worker processes on `url`, the driver's reads and writes on `admin_url` (the
/// same server; not through a pooler the workers use).
async fn schedule(
    backend: Backend,
    mode: Mode,
    (url, admin_url): (&str, &str),
    rng: &mut Rng,
) -> Outcome {
    let ns = unique_namespace(&format!("eo_{}", mode.name()));
    let mut admin = match backend {
        Backend::Postgres => {
            let store =
                PostgresLeaseStore::connect(PostgresConfig::from_url(admin_url).with_schema(&ns))
                    .await
                    .unwrap();
            sqlx::query(&format!(
                "CREATE TABLE \"{ns}\".payments (run_id TEXT NOT NULL, fence BIGINT NOT NULL)"
            ))
            .execute(store.pool())
            .await
            .unwrap();
            Admin::Postgres(store)
        }
        Backend::Redis => {
            let store = RedisLeaseStore::connect(RedisConfig::from_url(url).with_namespace(&ns))
                .await
                .unwrap();
            let conn = redis::Client::open(url)
                .unwrap()
                .get_multiplexed_async_connection_with_config(
                    // A server busy with an fsync must not fail the test's own reads (the default is 500 ms).
                    &redis::AsyncConnectionConfig::new()
                        .set_response_timeout(Some(std::time::Duration::from_secs(30))),
                )
                .await
                .unwrap();
            Admin::Redis(store, conn)
        }
    };
    let mut runs: Vec<RunId> = Vec::new();
    let add_runs = |n: usize, runs: &mut Vec<RunId>| -> Vec<RunId> {
        let start = runs.len();
        let new: Vec<RunId> = (start..start + n)
            .map(|i| RunId::new(format!("pay-{i:05}")).unwrap())
            .collect();
        runs.extend(new.iter().cloned());
        new
    };
    let first = add_runs(RUNS, &mut runs);
    admin.store().create_many(&first).await.unwrap();

    let started = Instant::now();
    let mut children: Vec<Child> = (0..CHILDREN)
        .map(|n| spawn(backend, mode, url, &ns, n))
        .collect();
    let mut kills = 0;
    let mut spawned = CHILDREN;
    loop {
        tokio::time::sleep(Duration::from_millis(40 + rng.below(80))).await;
        let victim = rng.below(CHILDREN as u64) as usize;
        children[victim]
            .process
            .start_kill()
            .expect("SIGKILL a worker");
        let _ = children[victim].process.wait().await;
        kills += 1;
        children[victim] = spawn(backend, mode, url, &ns, spawned);
        spawned += 1;
        if kills % 10 == 0 {
            let done = admin.completed(&runs).await;
            if done == runs.len() {
                if kills >= MIN_KILLS {
                    break;
                }
                let more = add_runs(50, &mut runs);
                admin.store().create_many(&more).await.unwrap();
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(240),
            "{backend:?} {mode:?}: not every run completed after {kills} kills: {} of {}",
            admin.completed(&runs).await,
            runs.len()
        );
    }
    for child in &mut children {
        let _ = child.process.start_kill();
        let _ = child.process.wait().await;
    }
    let took = started.elapsed();
    let effects = admin.effects(&runs).await;
    let mut completed_at = HashMap::new();
    for run in &runs {
        let record = admin.store().inspect(run).await.unwrap();
        assert_eq!(record.state, RunState::Completed, "{run}");
        completed_at.insert(run.to_string(), record.fence.get());
    }
    Outcome {
        runs: runs.len(),
        kills,
        effects,
        completed_at,
        took,
    }
}

/// Every completed run of `outcome` holds its effect exactly once, under its completion's fence.
fn exactly_once(outcome: &Outcome, mode: &str) {
    for (run, fence) in &outcome.completed_at {
        let rows = outcome
            .effects
            .get(run)
            .map(Vec::as_slice)
            .unwrap_or_default();
        assert_eq!(
            rows,
            [*fence],
            "{mode}: run {run}: the effect must be there exactly once, under its completion's fence"
        );
    }
}

async fn both_modes(backend: Backend, url: &str) {
    let mut rng = Rng::seeded();
    let seed = rng.0;
    let one = schedule(backend, Mode::One, (url, url), &mut rng).await;
    let two = schedule(backend, Mode::Two, (url, url), &mut rng).await;
    let max_rows = one.effects.values().map(Vec::len).max().unwrap_or(0);
    let doubled = two.effects.values().filter(|e| e.len() >= 2).count();
    let name = match backend {
        Backend::Postgres => "postgres",
        Backend::Redis => "redis",
    };
    println!(
        "exactly-once: {name} runs={} kills={} one-transaction: max rows per run {max_rows}; \
         two commits: runs with two rows {doubled}",
        one.runs, one.kills
    );
    eprintln!(
        "  (seed {seed}; one transaction: {} runs, {} kills, {:?}; two commits: {} runs, {} \
         kills, {:?})",
        one.runs, one.kills, one.took, two.runs, two.kills, two.took
    );
    assert!(one.kills >= MIN_KILLS && two.kills >= MIN_KILLS);
    exactly_once(&one, "one transaction");
    assert_eq!(max_rows, 1);
    if backend == Backend::Postgres {
        let batch = schedule(backend, Mode::Batch, (url, url), &mut rng).await;
        println!(
            "exactly-once: {name} runs={} kills={} group-committed effects: max rows per run {}",
            batch.runs,
            batch.kills,
            batch.effects.values().map(Vec::len).max().unwrap_or(0)
        );
        eprintln!("  (group-committed: {:?})", batch.took);
        assert!(batch.kills >= MIN_KILLS);
        exactly_once(&batch, "group-committed");
    }
    for run in two.completed_at.keys() {
        assert!(
            two.effects.get(run).is_some_and(|e| !e.is_empty()),
            "run {run} completed without its effect"
        );
    }
    assert!(
        doubled > 0,
        "the two-commit schedule doubled no effect: the test could not see a double execution"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_on_postgres_under_200_kills() {
    let Some(server) = required("postgres", PostgresServer::start(), PG_HINT) else {
        return;
    };
    both_modes(Backend::Postgres, &server.url()).await;
}

/// The two exactly-once modes with every worker process behind a private PgBouncer in
/// transaction mode (`pooler=transaction`): a killed worker's transaction, cut at the pooler,
/// commits nothing, and none of its settings or statements reaches another worker's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_on_postgres_through_pgbouncer_under_200_kills() {
    let Some(server) = required("postgres", PostgresServer::start(), PG_HINT) else {
        return;
    };
    let Some(bouncer) = required(
        "pgbouncer",
        PgBouncer::start(&server.url(), 10),
        PGBOUNCER_HINT,
    ) else {
        return;
    };
    let mut rng = Rng::seeded();
    let seed = rng.0;
    let urls = (bouncer.url(), server.url());
    let urls = (urls.0.as_str(), urls.1.as_str());
    for mode in [Mode::One, Mode::Batch] {
        let outcome = schedule(Backend::Postgres, mode, urls, &mut rng).await;
        println!(
            "exactly-once: postgres through pgbouncer ({}) runs={} kills={} max rows per run {}",
            mode.name(),
            outcome.runs,
            outcome.kills,
            outcome.effects.values().map(Vec::len).max().unwrap_or(0)
        );
        eprintln!("  (seed {seed}; {:?})", outcome.took);
        assert!(outcome.kills >= MIN_KILLS);
        exactly_once(&outcome, mode.name());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_on_redis_under_200_kills() {
    let server = match RedisServer::start() {
        Ok(server) => server,
        Err(why) => {
            return unavailable::<()>(
                "redis",
                why,
                "install redis-server (bash scripts/test.sh does it)",
            )
            .unwrap_or(())
        }
    };
    both_modes(Backend::Redis, &server.url()).await;
}
