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
mod cost;
mod effects;
mod extra;
mod fleet;
mod floor;
mod limit;
mod measure;
mod pickup;
mod raw;
mod setup;
mod sweep;
mod worker;

use measure::*;
use raw::{Raw, RawConn, Seen};
pub(crate) use setup::*;

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
        if args.parts.contains(&Part::Cost) {
            let jobs = args.cost_jobs;
            if target.kind == Kind::Postgres && keep_alive.0.is_some() {
                // A private durable server of its own, restarted with pg_stat_statements and
                // autovacuum off: the drain is the only writer its counters see.
                let (pg, durable) = durable_postgres(target, "the cost part").await?;
                if let RawConn::Pg(pool) = &durable.raw {
                    cost::prepare_postgres(&pg, pool).await?;
                }
                // The restart closed the pool: a new one.
                let cost_target = Target {
                    raw: RawConn::postgres(&durable.url, durable.pool).await?,
                    ..durable
                };
                extras.push(cost::cost(&cost_target, jobs).await?);
                drop(cost_target);
                drop(pg);
            } else {
                extras.push(cost::cost(target, jobs).await?);
            }
        }
        let effects_here = args.parts.contains(&Part::Effects) && target.kind == Kind::Postgres;
        let floor_here = args.parts.contains(&Part::Floor) && target.kind == Kind::Postgres;
        if args.parts.contains(&Part::Worker) || effects_here || floor_here {
            // Durable servers for the worker rows: a private Postgres with fsync and
            // synchronous_commit on (the shared fixture runs with them off), the Redis fixture
            // as it is (appendonly yes, appendfsync always). A --store server is used as is and
            // its settings are reported.
            let durable = if target.kind == Kind::Postgres && keep_alive.0.is_some() {
                Some(durable_postgres(target, "the worker rows").await?)
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
            if floor_here {
                eprintln!("bench: {backend} the Worker against the floor, {jobs} jobs");
                extras.push(floor::floor(target, jobs, &args.worker_counts).await?);
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

/// A private durable PostgreSQL (fsync and `synchronous_commit` on) for `what`, and a target
/// on it with `target`'s pool size and namespace prefix.
async fn durable_postgres(
    target: &Target,
    what: &str,
) -> Result<(PostgresServer, Target), BenchError> {
    eprintln!("bench: starting a durable PostgreSQL for {what}");
    let pg = tokio::task::spawn_blocking(PostgresServer::start_durable)
        .await
        .map_err(|e| BenchError::setup(e.to_string()))?
        .map_err(|e| BenchError::setup(format!("durable postgres fixture: {e}")))?;
    let url = pg.url();
    let durable = Target {
        kind: Kind::Postgres,
        raw: RawConn::postgres(&url, target.pool).await?,
        url,
        pool: target.pool,
        prefix: target.prefix.clone(),
    };
    Ok((pg, durable))
}

/// A human-readable rendering of one extra measurement.
fn describe(v: &Value) -> String {
    match v["part"].as_str() {
        Some("rslock") => best::describe(v),
        Some("sweep") => sweep::describe(v),
        Some("worker" | "handover") => worker::describe(v),
        Some("pickup") => pickup::describe(v),
        Some("effects") => effects::describe(v),
        Some("cost") => cost::describe(v),
        Some("floor") => floor::describe(v),
        _ => extra::describe(v),
    }
}

/// Where the raw path connects for a store URL: the same server, and behind a transaction
/// pooler (`pooler=transaction`) its direct address (`listen_url=`, required then): the raw
/// statements are the baseline on the server itself, and keep their prepared statements, which
/// the pooler would not.
fn raw_postgres_url(url: &str) -> Result<String, BenchError> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let param = |name: &str| {
        query
            .split('&')
            .find_map(|p| p.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
    };
    if param("pooler") != Some("transaction") {
        return Ok(url.to_owned());
    }
    let direct = param("listen_url").ok_or_else(|| {
        BenchError::setup(
            "behind pooler=transaction the bench needs listen_url=postgres://HOST:PORT, the \
             server's direct address, for its raw path",
        )
    })?;
    let rest = base.split_once("://").map_or(base, |(_, r)| r);
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let userinfo = authority.rfind('@').map_or("", |at| &authority[..=at]);
    let target = direct.split_once("://").map_or(direct, |(_, r)| r);
    let (host, own_path) = target.split_at(target.find('/').unwrap_or(target.len()));
    let path = if own_path.is_empty() { path } else { own_path };
    eprintln!("bench: the raw path connects to {host} directly, not through the pooler");
    Ok(format!("postgres://{userinfo}{host}{path}"))
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
            raw: RawConn::postgres(&raw_postgres_url(&url)?, pool).await?,
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
