//! The benchmark: the library against the identical raw statement or script, interleaved in
//! one run, plus batched heartbeats, claim_next under contention, takeover latency and memory.
//!
//! Every measured operation is validated afterwards against the store (fences, heartbeat
//! counters, journal rows, states), so a path that is fast because it skipped work fails.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use distribution::{Config, End, Ending, Error, Lease, LeaseStore, RunId, Ttl, WorkerId};
use lease_conformance::fixtures::{PostgresServer, RedisServer};
use serde_json::{json, Value};
use tokio::sync::Barrier;
use tokio::time::Instant;

use crate::Failure;

mod best;
mod effects;
mod extra;
mod limit;
mod pickup;
mod raw;
mod sweep;
mod worker;

use raw::{Raw, RawConn, Seen};

/// Arguments of `lease-bench` (besides the store, namespace and pool flags).
#[derive(clap::Args)]
pub(crate) struct BenchArgs {
    /// Print the results as JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// Also write the JSON results to this file.
    #[arg(long, value_name = "FILE")]
    json_out: Option<std::path::PathBuf>,
    /// A short run (fewer rounds and runs; about a minute per backend).
    #[arg(long)]
    quick: bool,
    /// Client counts to measure each operation at.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    clients: Vec<usize>,
    /// Operations per round per path, split between the clients (renew_many: calls / 25).
    #[arg(long, value_name = "N")]
    ops: Option<usize>,
    /// Measured A/B round pairs per operation and client count (plus one warm-up pair).
    #[arg(long, value_name = "N")]
    pairs: Option<usize>,
    /// Which parts to run (best, sweep and worker are not in the default run).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "ops,heartbeat,contention,takeover"
    )]
    parts: Vec<Part>,
    /// Table sizes of the sweep, in runs; default 10000,1000000 (--quick: 10000,100000).
    #[arg(long, value_delimiter = ',', value_name = "N,N")]
    sweep_sizes: Option<Vec<usize>>,
    /// Held leases in the sweep's held-leases case; default 100000 (--quick: 20000).
    #[arg(long, value_name = "N")]
    sweep_held: Option<usize>,
    /// Backlog each worker row drains; default 20000 (--quick: 5000).
    #[arg(long, value_name = "N")]
    worker_jobs: Option<usize>,
    /// Worker instance counts of the worker rows.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    worker_counts: Vec<usize>,
    /// Payload bytes each run of the worker rows is created with, which each handler reads
    /// and checks (0: none).
    #[arg(long, value_name = "N", default_value_t = 0)]
    worker_payload: usize,
    /// Kinds the runs of the worker rows are spread over, each served by its own handler of
    /// one Worker (`run_kinds`), paired with the same drain of one kind (1: none). With a
    /// payload too, a third drain has both.
    #[arg(long, value_name = "N", default_value_t = 1)]
    worker_kinds: usize,
    /// Runs held by the worker that shuts down in the handover test.
    #[arg(long, value_name = "N", default_value_t = 100)]
    handover_runs: usize,
    /// Runs drained by 16 workers in the claim_next contention test, per path.
    #[arg(long, value_name = "N")]
    contention_runs: Option<usize>,
    /// Runs each claim_next call of the contention test asks for.
    #[arg(long, value_name = "N", default_value_t = 10)]
    contention_batch: usize,
    /// Leases held by one worker in the heartbeat test.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    heartbeat_leases: usize,
    /// Heartbeat ticks (10 s each) observed per mode.
    #[arg(long, value_name = "N")]
    heartbeat_ticks: Option<u32>,
    /// SIGKILL takeover trials per backend.
    #[arg(long, value_name = "N", default_value_t = 20)]
    takeover_trials: usize,
    /// Lease TTL of the takeover trials, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1_000)]
    takeover_ttl_ms: u64,
}

/// A part of the benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Part {
    /// Library against raw, per operation and client count.
    Ops,
    /// Batched heartbeats of many leases against one renewal per scope, with memory per lease.
    Heartbeat,
    /// 16 workers draining runs with claim_next.
    Contention,
    /// SIGKILL a worker holding a run; time until another worker claims it.
    Takeover,
    /// The library against the best raw statement for the job (Postgres), and the library's
    /// claim → renew → release cycle against rslock's (Redis), with server CPU per cycle.
    Best,
    /// claim, renew, renew_many(1000) and claim_next(10) at growing table sizes.
    Sweep,
    /// The `Worker` runtime draining a backlog (durable servers), and graceful handover.
    Worker,
    /// Create → handler latency and idle load of 1 and 16 idle workers, wake-ups against
    /// polling.
    Pickup,
    /// Exactly-once effects (Postgres, durable server): the journaled effect, the effect in
    /// the handler's own transaction, and the group-committed `PgEffect`, at each worker count.
    Effects,
}

/// Why the benchmark stopped.
#[derive(Debug)]
pub(crate) enum BenchError {
    /// A fixture or setup step failed.
    Setup(String),
    /// An operation did not do what it should (refused, missing, or validation failed).
    Wrong(String),
    /// The library returned an error.
    Store(Error),
    /// sqlx on the raw path.
    Sql(sqlx::Error),
    /// redis-rs on the raw path.
    Redis(redis::RedisError),
}

impl BenchError {
    pub(crate) fn setup(why: impl Into<String>) -> BenchError {
        BenchError::Setup(why.into())
    }

    pub(crate) fn wrong(why: impl Into<String>) -> BenchError {
        BenchError::Wrong(why.into())
    }
}

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BenchError::Setup(why) => write!(f, "bench setup failed: {why}"),
            BenchError::Wrong(why) => write!(f, "bench validation failed: {why}"),
            BenchError::Store(e) => write!(f, "library call failed: {e}"),
            BenchError::Sql(e) => write!(f, "raw sqlx call failed: {e}"),
            BenchError::Redis(e) => write!(f, "raw redis call failed: {e}"),
        }
    }
}

impl From<Error> for BenchError {
    fn from(e: Error) -> Self {
        BenchError::Store(e)
    }
}

impl From<distribution::InvalidInput> for BenchError {
    fn from(e: distribution::InvalidInput) -> Self {
        BenchError::Store(e.into())
    }
}

impl From<sqlx::Error> for BenchError {
    fn from(e: sqlx::Error) -> Self {
        BenchError::Sql(e)
    }
}

impl From<redis::RedisError> for BenchError {
    fn from(e: redis::RedisError) -> Self {
        BenchError::Redis(e)
    }
}

impl From<BenchError> for Failure {
    fn from(e: BenchError) -> Failure {
        Failure {
            code: crate::exit::FAILURE,
            message: e.to_string(),
        }
    }
}

/// Which server a target is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Postgres,
    Redis,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Postgres => "postgres",
            Kind::Redis => "redis",
        }
    }
}

/// A server to benchmark.
pub(crate) struct Target {
    pub(crate) kind: Kind,
    pub(crate) url: String,
    pub(crate) raw: RawConn,
    /// Postgres pool size of both paths (`--max-connections`).
    pub(crate) pool: u32,
    /// Prefix of every namespace the bench creates (`--namespace`), with its separator.
    pub(crate) prefix: String,
}

/// Pool size of both paths unless `--max-connections` says otherwise: one connection per client
/// at the most clients measured.
const DEFAULT_POOL: u32 = 16;

impl Target {
    /// A fresh namespace for one measurement, named after `label`.
    pub(crate) fn namespace(&self, label: &str) -> String {
        lease_conformance::fixtures::unique_namespace(&format!("{}{label}", self.prefix))
    }

    /// A library store over namespace `ns`.
    pub(crate) async fn lib(&self, ns: &str) -> Result<Arc<dyn LeaseStore>, BenchError> {
        Ok(match self.kind {
            Kind::Postgres => Arc::new(
                distribution::postgres::PostgresLeaseStore::connect(
                    distribution::postgres::PostgresConfig::from_url(&self.url)
                        .with_schema(ns)
                        .with_max_connections(self.pool)
                        .with_acquire_timeout(Duration::from_secs(60)),
                )
                .await?,
            ),
            Kind::Redis => Arc::new(
                distribution::redis::RedisLeaseStore::connect(
                    distribution::redis::RedisConfig::from_url(&self.url)
                        .with_namespace(ns)
                        .with_response_timeout(Duration::from_secs(30)),
                )
                .await?,
            ),
        })
    }
}

/// The operations compared with their raw statements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Claim,
    Renew,
    Append,
    Complete,
    ClaimNext,
    RenewMany,
    /// claim_next(10).
    ClaimNextBatch,
    /// end_many of 100 complete-with ends.
    EndMany,
}

const OPS: [Op; 6] = [
    Op::Claim,
    Op::Renew,
    Op::Append,
    Op::Complete,
    Op::ClaimNext,
    Op::RenewMany,
];

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Claim => "claim",
            Op::Renew => "renew",
            Op::Append => "append",
            Op::Complete => "complete",
            Op::ClaimNext => "claim_next",
            Op::RenewMany => "renew_many(1000)",
            Op::ClaimNextBatch => "claim_next(10)",
            Op::EndMany => "end_many(100 complete-with)",
        }
    }

    /// Runs each call touches.
    fn width(self) -> usize {
        match self {
            Op::RenewMany => RENEW_MANY,
            Op::ClaimNextBatch => CLAIM_NEXT_BATCH,
            Op::EndMany => END_MANY,
            _ => 1,
        }
    }

    /// Calls per round for `ops` operations per round: the batch calls are fewer.
    fn calls(self, ops: usize) -> usize {
        match self {
            Op::RenewMany => ops / 25,
            Op::ClaimNextBatch => ops / 5,
            Op::EndMany => ops / 10,
            _ => ops,
        }
    }
}

/// The operations of the `best` part (Postgres).
const BEST_OPS: [Op; 5] = [
    Op::Claim,
    Op::Renew,
    Op::RenewMany,
    Op::ClaimNextBatch,
    Op::EndMany,
];

/// Which side of the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    Lib,
    Raw,
}

/// The lease TTL of every measured operation: long enough that nothing expires mid-run.
const TTL_MS: u64 = 600_000;
const PAYLOAD: &[u8] = &[b'x'; 64];
const RENEW_MANY: usize = 1_000;
const CLAIM_NEXT_BATCH: usize = 10;
const END_MANY: usize = 100;

/// Latency percentiles and throughput of one path.
#[derive(Clone, Debug, Default)]
pub(crate) struct Summary {
    pub(crate) ops: u64,
    pub(crate) secs: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) p999_us: f64,
}

impl Summary {
    pub(crate) fn of(mut latencies_ns: Vec<u64>, secs: f64) -> Summary {
        latencies_ns.sort_unstable();
        let pct = |q: f64| -> f64 {
            if latencies_ns.is_empty() {
                return 0.0;
            }
            let i = ((q * latencies_ns.len() as f64).ceil() as usize).clamp(1, latencies_ns.len());
            latencies_ns[i - 1] as f64 / 1_000.0
        };
        Summary {
            ops: latencies_ns.len() as u64,
            secs,
            p50_us: pct(0.50),
            p99_us: pct(0.99),
            p999_us: pct(0.999),
        }
    }

    pub(crate) fn ops_per_s(&self) -> f64 {
        if self.secs > 0.0 {
            self.ops as f64 / self.secs
        } else {
            0.0
        }
    }

    pub(crate) fn json(&self) -> Value {
        json!({"ops": self.ops, "secs": self.secs, "ops_per_s": self.ops_per_s(),
               "p50_us": self.p50_us, "p99_us": self.p99_us, "p999_us": self.p999_us})
    }
}

/// One row of the comparison.
struct OpResult {
    backend: Kind,
    op: Op,
    clients: usize,
    lib: Summary,
    /// The raw path: the identical statement, or the best one (`--parts best`).
    raw: Summary,
    validated: String,
}

impl OpResult {
    fn ratio(&self) -> f64 {
        self.lib.ops_per_s() / self.raw.ops_per_s().max(f64::MIN_POSITIVE)
    }

    fn p99_ratio(&self) -> f64 {
        self.lib.p99_us / self.raw.p99_us.max(f64::MIN_POSITIVE)
    }
}

/// What one client of one path works on.
struct ClientWork {
    worker: WorkerId,
    /// Claim: the runs to claim, one per op.
    runs: Vec<RunId>,
    /// Renew, append: one lease; complete: one lease per op; renew_many: the batch.
    leases: Vec<Lease>,
    /// Operations done so far (all rounds).
    done: usize,
    /// claim_next: what each call returned.
    claimed: Vec<(String, u64)>,
    /// end_many: the ends of every call, `END_MANY` per call, built before timing.
    endings: Vec<Ending>,
}

struct Sizes {
    pairs: usize,
    ops: usize,
}

pub(crate) async fn run(config: &Config, args: BenchArgs) -> Result<(), Failure> {
    let mut keep_alive: (Option<PostgresServer>, Option<RedisServer>) = (None, None);
    let targets = targets(config, &mut keep_alive).await?;
    let sizes = Sizes {
        pairs: args.pairs.unwrap_or(if args.quick { 2 } else { 5 }),
        ops: args.ops.unwrap_or(if args.quick { 200 } else { 500 }),
    };
    let mut report = json!({
        "machine": extra::machine(),
        "load_average_start": load_average(),
        "quick": args.quick,
        "pairs": sizes.pairs,
        "ops_per_round": sizes.ops,
    });
    let mut rows = Vec::new();
    let mut best_rows = Vec::new();
    let mut extras: Vec<Value> = Vec::new();
    for target in &targets {
        let backend = target.kind.name();
        if args.parts.contains(&Part::Ops) {
            for op in OPS {
                let ns = target.namespace(&format!("bench_{}", op.name().replace(['(', ')'], "")));
                let lib = target.lib(&ns).await?;
                let raw = Arc::new(target.raw.namespace(&ns));
                for &clients in &args.clients {
                    eprintln!("bench: {backend} {} with {clients} clients", op.name());
                    rows.push(measure(target.kind, op, clients, &lib, &raw, &sizes).await?);
                }
            }
        }
        if args.parts.contains(&Part::Heartbeat) {
            let ticks = args
                .heartbeat_ticks
                .unwrap_or(if args.quick { 1 } else { 2 });
            eprintln!(
                "bench: {backend} heartbeat of {} leases",
                args.heartbeat_leases
            );
            extras.push(extra::heartbeat(target, args.heartbeat_leases, ticks).await?);
        }
        if args.parts.contains(&Part::Contention) {
            let runs = args
                .contention_runs
                .unwrap_or(if args.quick { 10_000 } else { 100_000 });
            eprintln!("bench: {backend} claim_next contention over {runs} runs");
            extras.push(extra::contention(target, runs, args.contention_batch).await?);
        }
        if args.parts.contains(&Part::Takeover) {
            eprintln!("bench: {backend} takeover, {} trials", args.takeover_trials);
            extras.push(extra::takeover(target, args.takeover_trials, args.takeover_ttl_ms).await?);
        }
        if args.parts.contains(&Part::Best) {
            match target.kind {
                Kind::Postgres => {
                    for op in BEST_OPS {
                        let label = format!("best_{}", op.name().split('(').next().unwrap_or(""));
                        let ns = target.namespace(&label);
                        let lib = target.lib(&ns).await?;
                        let raw = Arc::new(target.raw.namespace_best(&ns));
                        for &clients in &args.clients {
                            eprintln!("bench: {backend} {} vs best, {clients} clients", op.name());
                            best_rows
                                .push(measure(target.kind, op, clients, &lib, &raw, &sizes).await?);
                        }
                    }
                }
                Kind::Redis => {
                    eprintln!("bench: {backend} claim → renew → release vs rslock");
                    extras.push(best::rslock(target, &args.clients, &sizes).await?);
                }
            }
        }
        if args.parts.contains(&Part::Pickup) {
            extras.push(pickup::pickup(target, args.quick).await?);
        }
        if args.parts.contains(&Part::Sweep) {
            let sizes = args.sweep_sizes.clone().unwrap_or(if args.quick {
                vec![10_000, 100_000]
            } else {
                vec![10_000, 1_000_000]
            });
            let held = args
                .sweep_held
                .unwrap_or(if args.quick { 20_000 } else { 100_000 });
            eprintln!("bench: {backend} table-size sweep {sizes:?}, {held} held");
            extras.push(sweep::sweep(target, &sizes, held, args.quick).await?);
        }
        let effects_here = args.parts.contains(&Part::Effects) && target.kind == Kind::Postgres;
        if args.parts.contains(&Part::Worker) || effects_here {
            // Durable servers for the worker rows: a private Postgres with fsync and
            // synchronous_commit on (the shared fixture runs with them off), the Redis fixture
            // as it is (appendonly yes, appendfsync always). A --store server is used as is and
            // its settings are reported.
            let durable = if target.kind == Kind::Postgres && keep_alive.0.is_some() {
                eprintln!("bench: starting a durable PostgreSQL for the worker rows");
                let pg = tokio::task::spawn_blocking(PostgresServer::start_durable)
                    .await
                    .map_err(|e| BenchError::setup(e.to_string()))?
                    .map_err(|e| BenchError::setup(format!("durable postgres fixture: {e}")))?;
                let url = pg.url();
                let durable_target = Target {
                    kind: Kind::Postgres,
                    raw: RawConn::postgres(&url, target.pool).await?,
                    url,
                    pool: target.pool,
                    prefix: target.prefix.clone(),
                };
                Some((pg, durable_target))
            } else {
                None
            };
            let target = durable.as_ref().map_or(target, |(_, t)| t);
            let jobs = args
                .worker_jobs
                .unwrap_or(if args.quick { 5_000 } else { 20_000 });
            if effects_here {
                eprintln!("bench: {backend} exactly-once effects, {jobs} jobs");
                extras.push(effects::effects(target, jobs, &args.worker_counts).await?);
            }
            if args.parts.contains(&Part::Worker) {
                eprintln!("bench: {backend} Worker runtime, {jobs} jobs");
                extras.push(
                    worker::throughput(
                        target,
                        jobs,
                        &args.worker_counts,
                        args.worker_payload,
                        args.worker_kinds,
                        args.quick,
                    )
                    .await?,
                );
                eprintln!("bench: {backend} Worker graceful handover");
                extras.push(worker::handover(target, args.handover_runs).await?);
            }
            // The durable server (if one was started) stops here.
            drop(durable);
        }
    }

    report["ops"] = Value::Array(
        rows.iter()
            .map(|r| {
                json!({"backend": r.backend.name(), "op": r.op.name(), "clients": r.clients,
                       "lib": r.lib.json(), "raw": r.raw.json(),
                       "ratio_ops_per_s": r.ratio(), "ratio_p99": r.p99_ratio(),
                       "validated": r.validated})
            })
            .collect(),
    );
    report["best"] = Value::Array(
        best_rows
            .iter()
            .map(|r| {
                json!({"backend": r.backend.name(), "op": r.op.name(), "clients": r.clients,
                       "lib": r.lib.json(), "best": r.raw.json(),
                       "ratio_ops_per_s": r.ratio(), "ratio_p99": r.p99_ratio(),
                       "validated": r.validated})
            })
            .collect(),
    );
    report["extra"] = Value::Array(extras.clone());
    report["load_average_end"] = json!(load_average());
    if let Some(path) = &args.json_out {
        std::fs::write(path, format!("{report:#}\n"))
            .map_err(|e| BenchError::setup(format!("cannot write {}: {e}", path.display())))?;
    }
    if args.json {
        println!("{report:#}");
    } else {
        let m = &report["machine"];
        println!(
            "machine: {} × {} ({}); servers and bench share it; load average (1/5/15 min) at start {}, at end {}\n",
            m["cores"],
            m["cpu"].as_str().unwrap_or("?"),
            m["os"].as_str().unwrap_or("?"),
            report["load_average_start"].as_str().unwrap_or("?"),
            report["load_average_end"].as_str().unwrap_or("?"),
        );
        print_table(&rows, "raw");
        if !best_rows.is_empty() {
            println!(
                "\nlibrary ÷ the best statement for the job (ops ratio = lib ops/s ÷ best ops/s)"
            );
            print_table(&best_rows, "best");
        }
        for e in &extras {
            println!("\n{}", describe(e));
        }
    }
    Ok(())
}

/// The first three fields of `/proc/loadavg`: other work on the machine during the run.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// A human-readable rendering of one extra measurement.
fn describe(v: &Value) -> String {
    match v["part"].as_str() {
        Some("rslock") => best::describe(v),
        Some("sweep") => sweep::describe(v),
        Some("worker" | "handover") => worker::describe(v),
        Some("pickup") => pickup::describe(v),
        Some("effects") => effects::describe(v),
        _ => extra::describe(v),
    }
}

/// The servers to run against: the configured store, or private fixture servers.
async fn targets(
    config: &Config,
    keep_alive: &mut (Option<PostgresServer>, Option<RedisServer>),
) -> Result<Vec<Target>, BenchError> {
    let url = config.store.clone();
    let pool = config.max_connections.unwrap_or(DEFAULT_POOL);
    let prefix = config
        .namespace
        .as_ref()
        .map(|ns| format!("{ns}_"))
        .unwrap_or_default();
    let mut out = Vec::new();
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        out.push(Target {
            kind: Kind::Postgres,
            raw: RawConn::postgres(&url, pool).await?,
            url,
            pool,
            prefix,
        });
    } else if url.starts_with("redis://") || url.starts_with("rediss://") {
        out.push(Target {
            kind: Kind::Redis,
            raw: RawConn::redis(&url).await?,
            url,
            pool,
            prefix,
        });
    } else {
        eprintln!("bench: no --store given; starting private PostgreSQL and Redis servers");
        let pg = tokio::task::spawn_blocking(PostgresServer::start)
            .await
            .map_err(|e| BenchError::setup(e.to_string()))?
            .map_err(|e| BenchError::setup(format!("postgres fixture: {e}")))?;
        let redis = tokio::task::spawn_blocking(RedisServer::start)
            .await
            .map_err(|e| BenchError::setup(e.to_string()))?
            .map_err(|e| BenchError::setup(format!("redis fixture: {e}")))?;
        let (pg_url, redis_url) = (pg.url(), redis.url());
        *keep_alive = (Some(pg), Some(redis));
        out.push(Target {
            kind: Kind::Postgres,
            raw: RawConn::postgres(&pg_url, pool).await?,
            url: pg_url,
            pool,
            prefix: prefix.clone(),
        });
        out.push(Target {
            kind: Kind::Redis,
            raw: RawConn::redis(&redis_url).await?,
            url: redis_url,
            pool,
            prefix,
        });
    }
    Ok(out)
}

fn worker_id(path: Path, op: Op, clients: usize, i: usize) -> Result<WorkerId, BenchError> {
    let side = match path {
        Path::Lib => "lib",
        Path::Raw => "raw",
    };
    Ok(WorkerId::new(format!(
        "{side}-{}-c{clients}-{i}",
        op.name()
    ))?)
}

/// Setup (not measured): the runs and leases each client of `path` needs for every round.
async fn prepare(
    op: Op,
    path: Path,
    clients: usize,
    per_round: usize,
    rounds: usize,
    lib: &Arc<dyn LeaseStore>,
    raw: &Raw,
) -> Result<Vec<ClientWork>, BenchError> {
    let ttl = Ttl::from_millis(TTL_MS)?;
    let mut work = Vec::with_capacity(clients);
    for i in 0..clients {
        let worker = worker_id(path, op, clients, i)?;
        let mut client = ClientWork {
            worker: worker.clone(),
            runs: Vec::new(),
            leases: Vec::new(),
            done: 0,
            claimed: Vec::new(),
            endings: Vec::new(),
        };
        let fresh = |n: usize| -> Vec<String> {
            (0..n)
                .map(|k| format!("{}-r{k}", worker.as_str()))
                .collect()
        };
        match op {
            Op::Claim => {
                let names = fresh(per_round * rounds);
                raw.create_all(&names).await?;
                client.runs = names
                    .into_iter()
                    .map(RunId::new)
                    .collect::<Result<_, _>>()?;
            }
            Op::ClaimNext => raw.create_all(&fresh(per_round * rounds)).await?,
            // A tenth more runs than the calls take: the two paths share the table, so one may
            // take more than its share before the other's last call.
            Op::ClaimNextBatch => {
                raw.create_all(&fresh(per_round * rounds * CLAIM_NEXT_BATCH * 11 / 10))
                    .await?
            }
            Op::Renew | Op::Append | Op::Complete | Op::RenewMany | Op::EndMany => {
                let n = match op {
                    Op::Complete => per_round * rounds,
                    Op::EndMany => per_round * rounds * END_MANY,
                    Op::RenewMany => RENEW_MANY,
                    _ => 1,
                };
                raw.create_all(&fresh(n)).await?;
                while client.leases.len() < n {
                    let max = (n - client.leases.len()).min(distribution::MAX_BATCH);
                    let got = lib.claim_next(&worker, ttl, max).await?;
                    if got.is_empty() {
                        return Err(BenchError::setup("setup claims found nothing claimable"));
                    }
                    client.leases.extend(got);
                }
                if op == Op::EndMany {
                    client.endings = client
                        .leases
                        .iter()
                        .map(|l| Ending::new(l.clone(), End::CompleteWith(PAYLOAD.to_vec())))
                        .collect();
                }
            }
        }
        work.push(client);
    }
    Ok(work)
}

/// Performs operation `k` of `op` on `path` for one client (the caller times it). `batch` is the
/// client's leases as raw tuples, built before timing starts.
#[allow(clippy::too_many_arguments)]
async fn one(
    op: Op,
    path: Path,
    k: usize,
    client: &ClientWork,
    batch: &[(&str, u64, u64)],
    ttl: Ttl,
    lib: &Arc<dyn LeaseStore>,
    raw: &Raw,
    claimed: &mut Vec<(String, u64)>,
) -> Result<(), BenchError> {
    match (op, path) {
        (Op::Claim, Path::Lib) => {
            let lease = lib.claim(&client.runs[k], &client.worker, ttl).await?;
            if lease.fence().get() != 1 {
                return Err(BenchError::wrong("claim of a fresh run: fence 1"));
            }
        }
        (Op::Claim, Path::Raw) => {
            let run = client.runs[k].as_str();
            let fence = if raw.is_best() {
                raw.best_claim(run, client.worker.as_str(), TTL_MS).await?
            } else {
                raw.claim(run, client.worker.as_str(), TTL_MS).await?
            };
            if fence != 1 {
                return Err(BenchError::wrong("raw claim of a fresh run: fence 1"));
            }
        }
        (Op::Renew, Path::Lib) => drop(lib.renew(&client.leases[0]).await?),
        (Op::Renew, Path::Raw) if raw.is_best() => {
            let (run, fence, ttl) = batch[0];
            raw.best_renew(run, fence, ttl).await?
        }
        (Op::Renew, Path::Raw) => {
            let (run, fence, ttl) = batch[0];
            raw.renew(run, fence, ttl).await?
        }
        (Op::Append, Path::Lib) => {
            if lib.append(&client.leases[0], PAYLOAD).await?.seq == 0 {
                return Err(BenchError::wrong("append: seq from 1"));
            }
        }
        (Op::Append, Path::Raw) => {
            let (run, fence, _) = batch[0];
            if raw.append(run, fence, PAYLOAD).await? == 0 {
                return Err(BenchError::wrong("raw append: seq from 1"));
            }
        }
        (Op::Complete, Path::Lib) => lib.complete(&client.leases[k]).await?,
        (Op::Complete, Path::Raw) => {
            let (run, fence, _) = batch[k];
            raw.complete(run, fence).await?
        }
        (Op::ClaimNext, Path::Lib) => {
            let got = lib.claim_next(&client.worker, ttl, 1).await?;
            let [lease] = got.as_slice() else {
                return Err(BenchError::wrong("claim_next(1) returned no run"));
            };
            claimed.push((lease.run().as_str().to_owned(), lease.fence().get()));
        }
        (Op::ClaimNext, Path::Raw) => {
            let got = raw.claim_next(client.worker.as_str(), TTL_MS, 1).await?;
            if got.len() != 1 {
                return Err(BenchError::wrong("raw claim_next(1) returned no run"));
            }
            claimed.extend(got);
        }
        (Op::RenewMany, Path::Lib) => {
            for result in lib.renew_many(&client.leases).await? {
                result?;
            }
        }
        (Op::RenewMany, Path::Raw) if raw.is_best() => raw.best_renew_many(batch).await?,
        (Op::RenewMany, Path::Raw) => raw.renew_many(batch).await?,
        (Op::ClaimNextBatch, Path::Lib) => {
            let got = lib
                .claim_next(&client.worker, ttl, CLAIM_NEXT_BATCH)
                .await?;
            if got.len() != CLAIM_NEXT_BATCH {
                return Err(BenchError::wrong(format!(
                    "claim_next({CLAIM_NEXT_BATCH}) returned {} runs",
                    got.len()
                )));
            }
            claimed.extend(
                got.iter()
                    .map(|l| (l.run().as_str().to_owned(), l.fence().get())),
            );
        }
        (Op::ClaimNextBatch, Path::Raw) => {
            let worker = client.worker.as_str();
            let got = if raw.is_best() {
                raw.best_claim_next(worker, TTL_MS, CLAIM_NEXT_BATCH)
                    .await?
            } else {
                raw.claim_next(worker, TTL_MS, CLAIM_NEXT_BATCH).await?
            };
            if got.len() != CLAIM_NEXT_BATCH {
                return Err(BenchError::wrong(format!(
                    "raw claim_next({CLAIM_NEXT_BATCH}) returned {} runs",
                    got.len()
                )));
            }
            claimed.extend(got);
        }
        (Op::EndMany, Path::Lib) => {
            let ends = &client.endings[k * END_MANY..(k + 1) * END_MANY];
            for result in lib.end_many(ends).await? {
                result?;
            }
        }
        (Op::EndMany, Path::Raw) => {
            if !raw.is_best() {
                return Err(BenchError::setup(
                    "end_many is measured against the best statement only (--parts best)",
                ));
            }
            raw.best_end_many(&batch[k * END_MANY..(k + 1) * END_MANY], PAYLOAD)
                .await?
        }
    }
    Ok(())
}

fn raw_batch(client: &ClientWork) -> Vec<(&str, u64, u64)> {
    client
        .leases
        .iter()
        .map(|l| (l.run().as_str(), l.fence().get(), l.ttl().as_millis()))
        .collect()
}

/// What one round of both paths measured.
struct PairRound {
    lib_work: Vec<ClientWork>,
    raw_work: Vec<ClientWork>,
    lib_lat: Vec<u64>,
    raw_lat: Vec<u64>,
}

/// Runs round `round` of both paths at once: every client does `per_round` operations on each
/// path, **alternating library and raw call by call** (and which of the two goes first), so a
/// stall of the server or the machine (an AOF fsync, autovacuum, a scheduler hiccup) falls on
/// both paths alike instead of on whichever round it happens to hit.
async fn round_pair(
    op: Op,
    per_round: usize,
    round: usize,
    lib_work: Vec<ClientWork>,
    raw_work: Vec<ClientWork>,
    lib: &Arc<dyn LeaseStore>,
    raw: &Arc<Raw>,
) -> Result<PairRound, BenchError> {
    let start = Arc::new(Barrier::new(lib_work.len() + 1));
    let mut tasks = Vec::with_capacity(lib_work.len());
    for (mut lib_client, mut raw_client) in lib_work.into_iter().zip(raw_work) {
        let (start, lib, raw) = (start.clone(), lib.clone(), raw.clone());
        tasks.push(tokio::spawn(async move {
            let ttl = Ttl::from_millis(TTL_MS)?;
            let (mut lib_lat, mut raw_lat) =
                (Vec::with_capacity(per_round), Vec::with_capacity(per_round));
            let (mut lib_claimed, mut raw_claimed) = (Vec::new(), Vec::new());
            let lib_batch = raw_batch(&lib_client);
            let raw_batch = raw_batch(&raw_client);
            start.wait().await;
            for k in round * per_round..(round + 1) * per_round {
                let order = if k % 2 == 0 {
                    [Path::Lib, Path::Raw]
                } else {
                    [Path::Raw, Path::Lib]
                };
                for path in order {
                    let (client, batch, claimed, lat) = match path {
                        Path::Lib => (&lib_client, &lib_batch, &mut lib_claimed, &mut lib_lat),
                        Path::Raw => (&raw_client, &raw_batch, &mut raw_claimed, &mut raw_lat),
                    };
                    let t0 = Instant::now();
                    one(op, path, k, client, batch, ttl, &lib, &raw, claimed).await?;
                    lat.push(t0.elapsed().as_nanos() as u64);
                }
            }
            drop((lib_batch, raw_batch));
            lib_client.done += per_round;
            raw_client.done += per_round;
            lib_client.claimed.extend(lib_claimed);
            raw_client.claimed.extend(raw_claimed);
            Ok::<_, BenchError>((lib_client, raw_client, lib_lat, raw_lat))
        }));
    }
    start.wait().await;
    let mut out = PairRound {
        lib_work: Vec::with_capacity(tasks.len()),
        raw_work: Vec::with_capacity(tasks.len()),
        lib_lat: Vec::new(),
        raw_lat: Vec::new(),
    };
    for task in tasks {
        let (l, r, ll, rl) = task.await.map_err(|e| BenchError::setup(e.to_string()))??;
        out.lib_work.push(l);
        out.raw_work.push(r);
        out.lib_lat.extend(ll);
        out.raw_lat.extend(rl);
    }
    Ok(out)
}

/// A path's throughput time: the time its calls took, summed over clients and divided by the
/// client count (each client spends about half its wall time on each path).
fn busy_secs(latencies_ns: &[u64], clients: usize) -> f64 {
    latencies_ns.iter().sum::<u64>() as f64 / 1e9 / clients as f64
}

/// Measures `op` at `clients` clients: a warm-up round, then `pairs` rounds in which every
/// client alternates library and raw calls.
async fn measure(
    kind: Kind,
    op: Op,
    clients: usize,
    lib: &Arc<dyn LeaseStore>,
    raw: &Arc<Raw>,
    sizes: &Sizes,
) -> Result<OpResult, BenchError> {
    let total = op.calls(sizes.ops).max(clients);
    let per_round = total.div_ceil(clients).max(1);
    let rounds = sizes.pairs + 1;
    let mut lib_work = prepare(op, Path::Lib, clients, per_round, rounds, lib, raw).await?;
    let mut raw_work = prepare(op, Path::Raw, clients, per_round, rounds, lib, raw).await?;
    let (mut lib_lat, mut raw_lat) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        let pair = round_pair(op, per_round, r, lib_work, raw_work, lib, raw).await?;
        (lib_work, raw_work) = (pair.lib_work, pair.raw_work);
        // Round 0 warms both paths up (connections, prepared statements, script cache).
        if r > 0 {
            lib_lat.extend(pair.lib_lat);
            raw_lat.extend(pair.raw_lat);
        }
    }
    let (lib_secs, raw_secs) = (busy_secs(&lib_lat, clients), busy_secs(&raw_lat, clients));
    let mut checked = validate(op, &lib_work, raw).await?;
    checked += validate(op, &raw_work, raw).await?;
    if matches!(op, Op::ClaimNext | Op::ClaimNextBatch) {
        let mut all = std::collections::HashSet::new();
        for c in lib_work.iter().chain(&raw_work) {
            for (run, _) in &c.claimed {
                if !all.insert(run.clone()) {
                    return Err(BenchError::wrong(format!(
                        "claim_next handed out {run} twice"
                    )));
                }
            }
        }
    }
    Ok(OpResult {
        backend: kind,
        op,
        clients,
        lib: Summary::of(lib_lat, lib_secs),
        raw: Summary::of(raw_lat, raw_secs),
        validated: format!("{checked} effects checked"),
    })
}

/// Checks in the store that every operation of `work` happened; returns how many were checked.
async fn validate(op: Op, work: &[ClientWork], raw: &Raw) -> Result<usize, BenchError> {
    let mut checked = 0;
    for c in work {
        let worker = Some(c.worker.as_str().to_owned());
        let fail = |what: String| {
            Err(BenchError::wrong(format!(
                "{} {}: {what}",
                op.name(),
                c.worker
            )))
        };
        match op {
            Op::Claim => {
                let names: Vec<String> = c.runs.iter().map(|r| r.as_str().to_owned()).collect();
                for (run, seen) in names.iter().zip(raw.seen(&names).await?) {
                    if (seen.fence, &seen.owner) != (1, &worker) {
                        return fail(format!("run {run} not claimed once by us: {seen:?}"));
                    }
                    checked += 1;
                }
            }
            Op::ClaimNext | Op::ClaimNextBatch => {
                if c.claimed.len() != c.done * op.width() {
                    return fail(format!("{} claims for {} calls", c.claimed.len(), c.done));
                }
                let names: Vec<String> = c.claimed.iter().map(|(r, _)| r.clone()).collect();
                for ((run, fence), seen) in c.claimed.iter().zip(raw.seen(&names).await?) {
                    if (seen.fence, &seen.owner) != (*fence, &worker) || *fence != 1 {
                        return fail(format!("run {run} fence {fence}: store has {seen:?}"));
                    }
                    checked += 1;
                }
            }
            Op::Renew | Op::Append | Op::RenewMany | Op::Complete | Op::EndMany => {
                let names: Vec<String> = c
                    .leases
                    .iter()
                    .map(|l| l.run().as_str().to_owned())
                    .collect();
                let seen: Vec<Seen> = raw.seen(&names).await?;
                for (i, (run, s)) in names.iter().zip(seen).enumerate() {
                    let ok = match op {
                        Op::Renew => s.heartbeats == c.done as u64,
                        Op::RenewMany => s.heartbeats == c.done as u64,
                        Op::Append => s.journal == c.done as u64,
                        // Completed with its one journal entry, or untouched.
                        Op::EndMany => {
                            let ended = i < c.done * END_MANY;
                            ended == (s.state == "completed")
                                && s.journal == u64::from(ended)
                                && s.fence == c.leases[i].fence().get()
                        }
                        _ => (i < c.done) == (s.state == "completed"),
                    };
                    if !ok {
                        return fail(format!("run {run} after {} ops: {s:?}", c.done));
                    }
                    checked += match op {
                        Op::Complete => usize::from(i < c.done),
                        Op::EndMany => usize::from(i < c.done * END_MANY),
                        _ => c.done,
                    };
                }
            }
        }
    }
    Ok(checked)
}

/// Prints the rows against the identical statement (`versus` = "raw", with the targets) or
/// against the best statement for the job (`versus` = "best").
fn print_table(rows: &[OpResult], versus: &str) {
    if rows.is_empty() {
        return;
    }
    let v = versus;
    println!(
        "| backend | operation | clients | lib ops/s | {v} ops/s | ops ratio | lib p50 µs | {v} p50 µs | lib p99 µs | {v} p99 µs | p99 ratio | lib p99.9 µs | {v} p99.9 µs | validated |"
    );
    println!("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|");
    for r in rows {
        println!(
            "| {} | {} | {} | {:.0} | {:.0} | {:.2} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.0} | {:.0} | {} |",
            r.backend.name(),
            r.op.name(),
            r.clients,
            r.lib.ops_per_s(),
            r.raw.ops_per_s(),
            r.ratio(),
            r.lib.p50_us,
            r.raw.p50_us,
            r.lib.p99_us,
            r.raw.p99_us,
            r.p99_ratio(),
            r.lib.p999_us,
            r.raw.p999_us,
            r.validated,
        );
    }
    if versus != "raw" {
        return;
    }
    let misses: Vec<String> = rows
        .iter()
        .filter(|r| r.ratio() < 0.9 || r.p99_ratio() > 1.2)
        .map(|r| format!("{} {} x{}", r.backend.name(), r.op.name(), r.clients))
        .collect();
    let mut by_backend: HashMap<&str, (f64, f64)> = HashMap::new();
    for r in rows {
        let e = by_backend
            .entry(r.backend.name())
            .or_insert((f64::MAX, 0.0));
        e.0 = e.0.min(r.ratio());
        e.1 = e.1.max(r.p99_ratio());
    }
    for (backend, (min_ratio, max_p99)) in by_backend {
        println!("\n{backend}: worst ops ratio {min_ratio:.2} (target ≥ 0.90), worst p99 ratio {max_p99:.2} (target ≤ 1.20)");
    }
    if misses.is_empty() {
        println!("every row meets the targets");
    } else {
        println!("rows missing a target: {}", misses.join(", "));
    }
}
