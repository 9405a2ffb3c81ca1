//! The `cost` part: what one drained job costs the store. A backlog is created, the server's
//! counters are read, one `Worker` (64 handlers, as peer-bench runs every peer) drains it, the
//! counters are read again, and each difference is divided by the jobs drained.
//!
//! - **Postgres** (a private durable server started with `pg_stat_statements` and autovacuum
//!   off, so nothing but the drain writes): statements and their server time
//!   (`pg_stat_statements`), transactions (`pg_stat_database`), WAL records, full-page images
//!   and bytes (`pg_stat_wal`), rows inserted, updated (HOT or not) and deleted, and index
//!   entries written (each insert and non-HOT update writes one entry per index of its
//!   table), from `pg_stat_user_tables` of the store's schema. Backends flush table and WAL
//!   counters when idle, within ten seconds: the second read waits for that.
//! - **Redis**: commands and their server time (`INFO commandstats` after `CONFIG
//!   RESETSTAT`), the server's CPU, the bytes appended to the AOF and the keys left.
//!
//! Two drains per backend: "complete" (the handler returns `End::Complete`) and "effect +
//! complete" (`End::CompleteWith`, a journal entry and the completion in one write).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distribution::{
    BoxError, CancellationToken, End, RunContext, RunId, Ttl, Worker, WorkerConfig, WorkerId,
};
use serde_json::{json, Value};
use sqlx::Row;
use tokio::sync::Notify;

use super::raw::RawConn;
use super::sweep::drop_namespace;
use super::worker::{create_backlog, effect};
use super::{BenchError, Target};

/// Handlers of the one Worker: what peer-bench gives each peer.
const CONCURRENCY: usize = 64;

/// Turns a Postgres server's cost counters on: `pg_stat_statements` loaded (the server is
/// restarted) and autovacuum off, so the drain is the only writer.
pub(crate) async fn prepare_postgres(
    server: &lease_conformance::fixtures::PostgresServer,
    pool: &sqlx::PgPool,
) -> Result<(), BenchError> {
    for setting in [
        "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'",
        "ALTER SYSTEM SET autovacuum = off",
        "ALTER SYSTEM SET track_io_timing = on",
    ] {
        sqlx::query(setting).execute(pool).await?;
    }
    pool.close().await;
    server.stop().map_err(BenchError::setup)?;
    server.start_again().map_err(BenchError::setup)?;
    Ok(())
}

/// The cost of a drained job on `target`, both drains.
pub(super) async fn cost(target: &Target, jobs: usize) -> Result<Value, BenchError> {
    if let RawConn::Pg(pool) = &target.raw {
        sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .execute(pool)
            .await?;
    }
    let mut rows = Vec::new();
    for effect in [false, true] {
        eprintln!(
            "bench: {} cost of {jobs} jobs, {}",
            target.kind.name(),
            if effect {
                "effect + complete"
            } else {
                "complete"
            }
        );
        rows.push(drain(target, jobs, effect).await?);
    }
    Ok(json!({
        "part": "cost",
        "backend": target.kind.name(),
        "jobs": jobs,
        "concurrency": CONCURRENCY,
        "rows": rows,
    }))
}

/// Creates `jobs` runs, reads the counters, drains them with one Worker, reads again.
async fn drain(target: &Target, jobs: usize, with_effect: bool) -> Result<Value, BenchError> {
    let ns = target.namespace("cost");
    let lib = target.lib(&ns).await?;
    let names: Vec<RunId> = (0..jobs)
        .map(|i| RunId::new(format!("job-{i:07}")))
        .collect::<Result<_, _>>()?;
    create_backlog(&lib, &names).await?;
    settle(target).await;
    let before = Counters::read(target, &ns, true).await?;

    let done = Arc::new(AtomicU64::new(0));
    let all = Arc::new(Notify::new());
    let shutdown = CancellationToken::new();
    let config = WorkerConfig::new(Ttl::from_secs(30)?)
        .with_concurrency(CONCURRENCY)
        .with_batch(250, Duration::from_millis(2))
        .with_poll_interval(Duration::from_millis(50));
    let worker = {
        let (done, all) = (done.clone(), all.clone());
        Worker::new(lib.clone(), WorkerId::new("cost-worker")?, config)?.on_end(move |report| {
            if report.result.is_ok() && done.fetch_add(1, Ordering::Relaxed) + 1 == jobs as u64 {
                all.notify_one();
            }
        })
    };
    let handler = move |ctx: RunContext| async move {
        Ok::<_, BoxError>(if with_effect {
            End::CompleteWith(effect(ctx.run(), ctx.fence().get()))
        } else {
            End::Complete
        })
    };
    let running = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move { worker.run(handler, shutdown).await })
    };
    let waited = tokio::time::timeout(Duration::from_secs(300), all.notified()).await;
    shutdown.cancel();
    let report = running
        .await
        .map_err(|e| BenchError::setup(e.to_string()))??;
    if waited.is_err() || report.completed != jobs as u64 {
        return Err(BenchError::wrong(format!(
            "the cost drain completed {} of {jobs} jobs",
            report.completed
        )));
    }
    // The store's connections close, and their backends flush what they counted.
    drop(lib);
    settle(target).await;
    let after = Counters::read(target, &ns, false).await?;
    validate(target, &ns, &names, with_effect).await?;
    drop_namespace(target, &ns).await?;
    Ok(json!({
        "drain": if with_effect { "effect + complete" } else { "complete" },
        "jobs": jobs,
        "claimed": report.claimed,
        "end_batches": report.batches,
        "per_job": after.per_job(&before, jobs),
        "top": after.top(jobs),
    }))
}

/// Waits for the server's counters to catch up: Postgres backends flush table and WAL counts
/// when idle, at most ten seconds after their last flush.
async fn settle(target: &Target) {
    if matches!(target.raw, RawConn::Pg(_)) {
        tokio::time::sleep(Duration::from_secs(11)).await;
    }
}

/// Every run completed, with a journal entry exactly when the drain wrote effects.
async fn validate(
    target: &Target,
    ns: &str,
    names: &[RunId],
    with_effect: bool,
) -> Result<(), BenchError> {
    let text: Vec<String> = names.iter().map(|r| r.as_str().to_owned()).collect();
    let seen = target.raw.namespace(ns).seen(&text).await?;
    let want = u64::from(with_effect);
    match text
        .iter()
        .zip(&seen)
        .find(|(_, s)| s.state != "completed" || s.journal != want)
    {
        Some((run, s)) => Err(BenchError::wrong(format!(
            "cost run {run}: expected completed with {want} journal entries, store has {s:?}"
        ))),
        None => Ok(()),
    }
}

/// The server's counters at one instant.
#[derive(Debug, Default)]
struct Counters {
    /// Named figures (statements, transactions, WAL, rows, commands, CPU, AOF bytes).
    figures: Vec<(&'static str, f64)>,
    /// Per statement or command: (name, calls, server ms, WAL bytes).
    items: Vec<(String, f64, f64, f64)>,
}

impl Counters {
    async fn read(target: &Target, ns: &str, reset: bool) -> Result<Counters, BenchError> {
        match &target.raw {
            RawConn::Pg(pool) => pg_counters(pool, ns, reset).await,
            RawConn::Redis(conn) => redis_counters(&mut conn.clone(), reset).await,
        }
    }

    fn figure(&self, name: &str) -> f64 {
        self.figures
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(0.0, |(_, v)| *v)
    }

    fn per_job(&self, before: &Counters, jobs: usize) -> Value {
        let mut out = serde_json::Map::new();
        for (name, value) in &self.figures {
            out.insert(
                (*name).to_owned(),
                json!((value - before.figure(name)) / jobs as f64),
            );
        }
        Value::Object(out)
    }

    /// The statements or commands, most called first, per job (the counters were reset
    /// before the drain).
    fn top(&self, jobs: usize) -> Value {
        let mut items = self.items.clone();
        items.sort_by(|a, b| b.1.total_cmp(&a.1));
        let n = jobs as f64;
        Value::Array(
            items
                .into_iter()
                .filter(|i| i.1 > 0.0)
                .take(12)
                .map(|(name, calls, ms, wal)| {
                    json!({"what": name, "calls": calls / n, "server_us": ms * 1000.0 / n, "wal_bytes": wal / n})
                })
                .collect(),
        )
    }
}

async fn pg_counters(pool: &sqlx::PgPool, ns: &str, reset: bool) -> Result<Counters, BenchError> {
    let mut c = Counters::default();
    let wal = sqlx::query(
        "SELECT wal_records::float8, wal_fpi::float8, wal_bytes::float8 FROM pg_stat_wal",
    )
    .fetch_one(pool)
    .await?;
    c.figures.push(("wal_records", wal.try_get(0)?));
    c.figures.push(("wal_full_page_images", wal.try_get(1)?));
    c.figures.push(("wal_bytes", wal.try_get(2)?));
    let commits: f64 = sqlx::query(
        "SELECT xact_commit::float8 FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(pool)
    .await?
    .try_get(0)?;
    c.figures.push(("transactions", commits));
    let tables = sqlx::query(
        "SELECT coalesce(sum(n_tup_ins), 0)::float8, coalesce(sum(n_tup_upd), 0)::float8, \
                coalesce(sum(n_tup_hot_upd), 0)::float8, coalesce(sum(n_tup_del), 0)::float8, \
                coalesce(sum((n_tup_ins + n_tup_upd - n_tup_hot_upd) \
                    * (SELECT count(*) FROM pg_index i WHERE i.indrelid = t.relid)), 0)::float8 \
         FROM pg_stat_user_tables t WHERE schemaname = $1",
    )
    .bind(ns)
    .fetch_one(pool)
    .await?;
    c.figures.push(("rows_inserted", tables.try_get(0)?));
    c.figures.push(("rows_updated", tables.try_get(1)?));
    c.figures.push(("rows_updated_hot", tables.try_get(2)?));
    c.figures.push(("rows_deleted", tables.try_get(3)?));
    c.figures
        .push(("index_entries_written", tables.try_get(4)?));
    if reset {
        sqlx::query("SELECT pg_stat_statements_reset()")
            .execute(pool)
            .await?;
        return Ok(c);
    }
    // The store's statements only: not the bench's own reads of the counters.
    let statements = sqlx::query(
        "SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 90), calls::float8, \
                total_exec_time, wal_bytes::float8 \
         FROM pg_stat_statements \
         WHERE query NOT LIKE '%pg_stat%' AND query NOT LIKE '%pg_index%'",
    )
    .fetch_all(pool)
    .await?;
    let (mut calls, mut ms) = (0.0, 0.0);
    for row in statements {
        let item: (String, f64, f64, f64) = (
            row.try_get(0)?,
            row.try_get(1)?,
            row.try_get(2)?,
            row.try_get(3)?,
        );
        calls += item.1;
        ms += item.2;
        c.items.push(item);
    }
    c.figures.push(("statements", calls));
    c.figures.push(("statement_server_us", ms * 1000.0));
    Ok(c)
}

async fn redis_counters(
    conn: &mut redis::aio::ConnectionManager,
    reset: bool,
) -> Result<Counters, BenchError> {
    let mut c = Counters::default();
    let (commands, cpu) = super::best::server_stats(conn).await?;
    c.figures.push(("server_cpu_us", cpu * 1e6));
    let persistence: String = redis::cmd("INFO")
        .arg("persistence")
        .query_async(conn)
        .await?;
    let aof = persistence
        .lines()
        .find_map(|l| l.strip_prefix("aof_current_size:"))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    c.figures.push(("aof_bytes", aof));
    let keys: f64 = redis::cmd("DBSIZE").query_async::<u64>(conn).await? as f64;
    c.figures.push(("keys", keys));
    if reset {
        redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async::<()>(conn)
            .await?;
        return Ok(c);
    }
    let (mut calls, mut us) = (0.0, 0.0);
    for (name, (n, usec)) in commands {
        if matches!(
            name.as_str(),
            "info" | "config|resetstat" | "dbsize" | "config"
        ) {
            continue;
        }
        calls += n as f64;
        us += usec as f64;
        c.items.push((name, n as f64, usec as f64 / 1000.0, 0.0));
    }
    c.figures.push(("commands", calls));
    c.figures.push(("command_server_us", us));
    Ok(c)
}

/// The part's tables.
pub(super) fn describe(v: &Value) -> String {
    let mut out = format!(
        "cost per drained job — {} ({} jobs, one Worker of {} handlers)\n",
        v["backend"].as_str().unwrap_or("?"),
        v["jobs"],
        v["concurrency"]
    );
    for row in v["rows"].as_array().into_iter().flatten() {
        out.push_str(&format!("  {}:\n", row["drain"].as_str().unwrap_or("?")));
        if let Some(per) = row["per_job"].as_object() {
            for (name, value) in per {
                out.push_str(&format!(
                    "    {name:<24} {:>10.2}\n",
                    value.as_f64().unwrap_or(0.0)
                ));
            }
        }
        out.push_str("    by statement or command (per job: calls, server µs, WAL bytes):\n");
        for item in row["top"].as_array().into_iter().flatten() {
            out.push_str(&format!(
                "      {:>6.3} {:>8.1} {:>8.1}  {}\n",
                item["calls"].as_f64().unwrap_or(0.0),
                item["server_us"].as_f64().unwrap_or(0.0),
                item["wal_bytes"].as_f64().unwrap_or(0.0),
                item["what"].as_str().unwrap_or("?")
            ));
        }
    }
    out
}
