//! The `effects` part (Postgres): what exactly-once costs. The Worker drains a backlog whose
//! every job has one effect, three ways, at each worker count, in one run:
//!
//! - **journal**: the effect journaled with the completion (`End::CompleteWith`), group-committed
//!   by `end_many`: the rate the library reaches when the effect lives in the store;
//! - **own transaction**: the effect a row of the user's table, written in the handler's own
//!   transaction with `fence_in` + `end_in` and committed there (`End::Committed`): a
//!   transaction and a commit per job;
//! - **group-committed**: the same row handed to the Worker as a `PgEffect`, run in a savepoint
//!   of the batch transaction that ends the leases.
//!
//! Each drain is validated against the store: every run completed, and one journal entry or one
//! `payments` row per run, under its completion's fence.

use std::sync::Arc;
use std::time::Duration;

use distribution::postgres::{PgEffect, PostgresConfig, PostgresLeaseStore};
use distribution::{
    BoxError, End, Ended, LeaseStore, RunContext, RunState, Ttl, Worker, WorkerConfig, WorkerId,
};
use serde_json::{json, Value};
use tokio::time::Instant;

use super::fleet::Fleet;
use super::raw::RawConn;
use super::sweep::{drop_namespace, quoted};
use super::worker::job_names;
use super::{BenchError, Target};

/// How each job's effect is committed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Journal,
    OwnTransaction,
    GroupCommitted,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Journal => "journal",
            Mode::OwnTransaction => "own transaction",
            Mode::GroupCommitted => "group-committed",
        }
    }
}

const MODES: [Mode; 3] = [Mode::Journal, Mode::OwnTransaction, Mode::GroupCommitted];

fn config() -> Result<WorkerConfig, BenchError> {
    Ok(WorkerConfig::new(Ttl::from_secs(30)?)
        .with_concurrency(32)
        .with_batch(100, Duration::from_millis(1))
        .with_poll_interval(Duration::from_millis(50)))
}

/// The handler of `mode`: one effect per job, committed as the mode says.
fn handler(
    mode: Mode,
    store: Arc<PostgresLeaseStore>,
    insert: Arc<str>,
) -> impl Fn(
    RunContext,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<End, BoxError>> + Send>>
       + Send
       + Sync
       + 'static {
    move |ctx: RunContext| {
        let (store, insert) = (store.clone(), insert.clone());
        Box::pin(async move {
            let lease = ctx.lease();
            let (run, fence) = (lease.run().to_string(), lease.fence().get() as i64);
            match mode {
                Mode::Journal => Ok(End::CompleteWith(
                    format!("effect of {run} under fence {fence}").into_bytes(),
                )),
                Mode::OwnTransaction => {
                    let mut tx = store.pool().begin().await?;
                    store.fence_in(&mut tx, &lease).await?;
                    sqlx::query(&insert)
                        .bind(&run)
                        .bind(fence)
                        .execute(&mut *tx)
                        .await?;
                    store.end_in(&mut tx, &lease, End::Complete).await?;
                    tx.commit().await?;
                    Ok(End::Committed(Ended::Completed))
                }
                Mode::GroupCommitted => {
                    ctx.set_effect(PgEffect::statement(&*insert, [run.into(), fence.into()]))?;
                    Ok(End::Complete)
                }
            }
        })
    }
}

/// `workers` Workers drain `jobs` runs in `mode`; the row, validated.
async fn drain(
    target: &Target,
    mode: Mode,
    workers: usize,
    jobs: usize,
) -> Result<Value, BenchError> {
    let RawConn::Pg(pool) = &target.raw else {
        return Err(BenchError::setup("the effects part runs on Postgres"));
    };
    let ns = target.namespace("effects");
    let store = Arc::new(
        PostgresLeaseStore::connect(
            PostgresConfig::from_url(&target.url)
                .with_schema(&ns)
                .with_max_connections(target.pool)
                .with_acquire_timeout(Duration::from_secs(60)),
        )
        .await?,
    );
    let q = quoted(&ns);
    sqlx::query(&format!(
        "CREATE TABLE {q}.payments (run_id TEXT NOT NULL, fence BIGINT NOT NULL)"
    ))
    .execute(pool)
    .await?;
    let insert: Arc<str> =
        format!("INSERT INTO {q}.payments (run_id, fence) VALUES ($1, $2)").into();
    let names = job_names(jobs)?;
    for chunk in names.chunks(distribution::MAX_BATCH) {
        for result in store.create_many(chunk).await? {
            result?;
        }
    }
    let mut fleet = Fleet::new(jobs);
    let t0 = Instant::now();
    for w in 0..workers {
        let worker = fleet.counting(Worker::new(
            store.clone(),
            WorkerId::new(format!("bench-worker-{w}"))?,
            config()?,
        )?);
        let (shutdown, handler) = (
            fleet.shutdown(),
            handler(mode, store.clone(), insert.clone()),
        );
        fleet.spawn(async move { worker.run(handler, shutdown).await });
    }
    let limit = Duration::from_secs(600);
    let waited = fleet.wait(limit).await;
    let secs = t0.elapsed().as_secs_f64();
    let totals = fleet.stop().await?;
    if let Err(completed) = waited {
        return Err(BenchError::wrong(format!(
            "effects {}: {workers} workers completed {completed} of {jobs} jobs within {limit:?}",
            mode.name()
        )));
    }
    let (done, batches) = (totals.completed, totals.batches);
    let not_ok = totals.not_ok;
    if done != jobs as u64 || not_ok != 0 {
        return Err(BenchError::wrong(format!(
            "effects {}: {done} completed of {jobs}, {not_ok} refused, failed or errored",
            mode.name()
        )));
    }
    let validated = validate(pool, &q, mode, jobs).await?;
    drop_namespace(target, &ns).await?;
    Ok(json!({
        "mode": mode.name(),
        "workers": workers,
        "jobs": jobs,
        "secs": secs,
        "jobs_per_s": jobs as f64 / secs,
        "batches": batches,
        "validated": validated,
    }))
}

/// Every run completed, with exactly one effect (journal entry or payments row) under its
/// completion's fence.
async fn validate(
    pool: &sqlx::PgPool,
    q: &str,
    mode: Mode,
    jobs: usize,
) -> Result<String, BenchError> {
    let count = |sql: String| async move {
        let n: i64 = sqlx::query_scalar(&sql).fetch_one(pool).await?;
        Ok::<u64, BenchError>(n as u64)
    };
    let completed = count(format!(
        "SELECT count(*) FROM {q}.runs WHERE state = '{}'",
        RunState::Completed.as_str()
    ))
    .await?;
    let (table, what) = match mode {
        Mode::Journal => ("journal", "journal entry"),
        _ => ("payments", "payments row"),
    };
    // The bench's runs only: a Worker's purger journals its takeovers of the purge lease
    // (retention is on by default) in the lease run's journal.
    let effects = count(format!(
        "SELECT count(*) FROM {q}.{table} WHERE run_id LIKE 'job-%'"
    ))
    .await?;
    let at_fence = count(format!(
        "SELECT count(DISTINCT e.run_id) FROM {q}.{table} e JOIN {q}.runs r \
         ON r.run_id = e.run_id AND r.fence = e.fence AND r.state = 'completed'"
    ))
    .await?;
    let jobs = jobs as u64;
    if completed != jobs || effects != jobs || at_fence != jobs {
        return Err(BenchError::wrong(format!(
            "effects {}: {completed} of {jobs} runs completed, {effects} {what}s, {at_fence} runs \
             with one under their completion's fence",
            mode.name()
        )));
    }
    Ok(format!(
        "{jobs} runs completed, each with one {what} under its completion's fence"
    ))
}

/// The three modes at each worker count, one after another per count.
pub(super) async fn effects(
    target: &Target,
    jobs: usize,
    counts: &[usize],
) -> Result<Value, BenchError> {
    let RawConn::Pg(pool) = &target.raw else {
        return Err(BenchError::setup("the effects part runs on Postgres"));
    };
    let show = |name: &'static str| async move {
        let v: String = sqlx::query_scalar(&format!("SHOW {name}"))
            .fetch_one(pool)
            .await?;
        Ok::<String, BenchError>(format!("{name}={v}"))
    };
    let durable = format!(
        "{}, {}",
        show("fsync").await?,
        show("synchronous_commit").await?
    );
    let mut rows = Vec::new();
    for &workers in counts {
        let mut row = json!({"workers": workers});
        for mode in MODES {
            eprintln!(
                "bench: effects, {}, {workers} workers, {jobs} jobs",
                mode.name()
            );
            row[mode.name()] = drain(target, mode, workers, jobs).await?;
        }
        let rate = |m: Mode| row[m.name()]["jobs_per_s"].as_f64().unwrap_or(0.0);
        let (group, own, journal) = (
            rate(Mode::GroupCommitted),
            rate(Mode::OwnTransaction),
            rate(Mode::Journal),
        );
        row["group_over_own"] = json!(group / own);
        row["group_over_journal"] = json!(group / journal);
        rows.push(row);
    }
    Ok(json!({
        "part": "effects",
        "backend": target.kind.name(),
        "durability": durable,
        "rows": rows,
    }))
}

/// The rows as a table.
pub(super) fn describe(v: &Value) -> String {
    let f = |x: &Value| x.as_f64().unwrap_or(0.0);
    let mut out = format!(
        "exactly-once effects, {} ({}): the Worker (concurrency 32, batch 100, 1 ms) drains a backlog, each job one effect\n| workers | journal (End::CompleteWith) jobs/s | own transaction (fence_in + end_in) jobs/s | group-committed (PgEffect) jobs/s | group / own | group / journal | validated |\n|--:|--:|--:|--:|--:|--:|---|",
        v["backend"].as_str().unwrap_or("?"),
        v["durability"].as_str().unwrap_or("?")
    );
    for r in v["rows"].as_array().into_iter().flatten() {
        let rate = |m: Mode| f(&r[m.name()]["jobs_per_s"]);
        out += &format!(
            "\n| {} | {:.0} | {:.0} | {:.0} | {:.2}× | {:.2}× | {} |",
            r["workers"],
            rate(Mode::Journal),
            rate(Mode::OwnTransaction),
            rate(Mode::GroupCommitted),
            f(&r["group_over_own"]),
            f(&r["group_over_journal"]),
            MODES
                .iter()
                .map(|m| r[m.name()]["validated"].as_str().unwrap_or("").to_owned())
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    out
}
