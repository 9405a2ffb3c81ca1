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

use std::time::Duration;

use distribution::{BoxError, End, RunContext, RunId, Ttl, Worker, WorkerConfig, WorkerId};
use serde_json::{json, Value};
use sqlx::Row;

use super::extra::{cpu_time, processes_cpu};
use super::fleet::Fleet;
use super::raw::RawConn;
use super::sweep::drop_namespace;
use super::worker::{create_backlog, effect, job_names};
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
        for extension in ["pg_stat_statements", "pg_walinspect"] {
            sqlx::query(&format!("CREATE EXTENSION IF NOT EXISTS {extension}"))
                .execute(pool)
                .await?;
        }
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

/// Creates `jobs` runs and drains them with one Worker, reading the counters before the
/// creation, between, and after the drain: the cost of each phase.
async fn drain(target: &Target, jobs: usize, with_effect: bool) -> Result<Value, BenchError> {
    let ns = target.namespace("cost");
    let lib = target.lib(&ns).await?;
    let names = job_names(jobs)?;
    settle(target).await;
    let start = Counters::read(target, &ns).await?;
    create_backlog(&lib, &names).await?;
    settle(target).await;
    let created = Counters::read(target, &ns).await?;

    let config = WorkerConfig::new(Ttl::from_secs(30)?)
        .with_concurrency(CONCURRENCY)
        .with_batch(250, Duration::from_millis(2))
        .with_poll_interval(Duration::from_millis(50));
    let mut fleet = Fleet::new(jobs);
    let worker = fleet.counting(Worker::new(
        lib.clone(),
        WorkerId::new("cost-worker")?,
        config,
    )?);
    let handler = move |ctx: RunContext| async move {
        Ok::<_, BoxError>(if with_effect {
            End::CompleteWith(effect(ctx.run(), ctx.fence().get()))
        } else {
            End::Complete
        })
    };
    let server_process = match target.raw {
        RawConn::Pg(_) => "postgres",
        RawConn::Redis(_) => "redis-server",
    };
    let cpu_before = (cpu_time(), processes_cpu(server_process));
    let shutdown = fleet.shutdown();
    fleet.spawn(async move { worker.run(handler, shutdown).await });
    let waited = fleet.wait(Duration::from_secs(300)).await;
    let totals = fleet.stop().await?;
    // Read before the store's connections close: a backend that exits takes its time along.
    let cpu_us = |now: Duration, before: Duration| {
        now.saturating_sub(before).as_secs_f64() * 1e6 / jobs as f64
    };
    let cpu = json!({
        "bench_process_us": cpu_us(cpu_time(), cpu_before.0),
        "server_processes_us": cpu_us(processes_cpu(server_process), cpu_before.1),
    });
    if waited.is_err() || totals.completed != jobs as u64 || totals.not_ok != 0 {
        return Err(BenchError::wrong(format!(
            "the cost drain completed {} of {jobs} jobs, {} refused, failed or errored",
            totals.completed, totals.not_ok
        )));
    }
    // The store's connections close, and their backends flush what they counted.
    drop(lib);
    settle(target).await;
    let drained = Counters::read(target, &ns).await?;
    validate(target, &ns, &names, with_effect).await?;
    drop_namespace(target, &ns).await?;
    Ok(json!({
        "drain": if with_effect { "effect + complete" } else { "complete" },
        "jobs": jobs,
        "claimed": totals.claimed,
        "end_batches": totals.batches,
        "create": created.per_job(&start, jobs),
        "create_top": created.top(jobs),
        "create_wal": wal_between(target, &start, &created, jobs).await?,
        "per_job": drained.per_job(&created, jobs),
        "top": drained.top(jobs),
        "wal": wal_between(target, &created, &drained, jobs).await?,
        "cpu": cpu,
    }))
}

/// Postgres: the WAL written between two readings, by record kind (`pg_walinspect`), per
/// job, most frequent first; index entries are the B-tree leaf inserts.
async fn wal_between(
    target: &Target,
    from: &Counters,
    to: &Counters,
    jobs: usize,
) -> Result<Value, BenchError> {
    let (RawConn::Pg(pool), Some(from), Some(to)) = (&target.raw, &from.lsn, &to.lsn) else {
        return Ok(Value::Null);
    };
    let rows = sqlx::query(
        "SELECT \"resource_manager/record_type\", count::float8, combined_size::float8 \
         FROM pg_get_wal_stats($1::pg_lsn, $2::pg_lsn, true) WHERE count > 0 \
         ORDER BY count DESC",
    )
    .bind(from)
    .bind(to)
    .fetch_all(pool)
    .await?;
    let n = jobs as f64;
    let mut out = Vec::new();
    for row in rows {
        let (kind, count, bytes): (String, f64, f64) =
            (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
        out.push(json!({"record": kind, "per_job": count / n, "bytes_per_job": bytes / n}));
    }
    Ok(Value::Array(out))
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
    /// Named running totals (transactions, WAL, rows, CPU, AOF bytes): a phase costs the
    /// difference between two readings.
    figures: Vec<(&'static str, f64)>,
    /// Named sums over the statements or commands counted since the last reading (which
    /// reset them): a phase costs the reading at its end.
    window: Vec<(&'static str, f64)>,
    /// Per statement or command: (name, calls, server ms, WAL bytes).
    items: Vec<(String, f64, f64, f64)>,
    /// Postgres: where the WAL stood.
    lsn: Option<String>,
}

impl Counters {
    /// Reads the counters, and resets the per-statement (or per-command) ones.
    async fn read(target: &Target, ns: &str) -> Result<Counters, BenchError> {
        match &target.raw {
            RawConn::Pg(pool) => pg_counters(pool, ns).await,
            RawConn::Redis(conn) => redis_counters(&mut conn.clone()).await,
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
        for (name, value) in &self.window {
            out.insert((*name).to_owned(), json!(value / jobs as f64));
        }
        Value::Object(out)
    }

    /// The statements or commands, most called first, per job (the counters were reset at
    /// the phase's start).
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

async fn pg_counters(pool: &sqlx::PgPool, ns: &str) -> Result<Counters, BenchError> {
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
                coalesce(sum(n_tup_hot_upd), 0)::float8, coalesce(sum(n_tup_del), 0)::float8 \
         FROM pg_stat_user_tables t WHERE schemaname = $1",
    )
    .bind(ns)
    .fetch_one(pool)
    .await?;
    c.figures.push(("rows_inserted", tables.try_get(0)?));
    c.figures.push(("rows_updated", tables.try_get(1)?));
    c.figures.push(("rows_updated_hot", tables.try_get(2)?));
    c.figures.push(("rows_deleted", tables.try_get(3)?));
    let lsn: String = sqlx::query("SELECT pg_current_wal_lsn()::text")
        .fetch_one(pool)
        .await?
        .try_get(0)?;
    c.lsn = Some(lsn);
    // The store's statements only: not the bench's own reads of the counters.
    let statements = sqlx::query(
        "SELECT left(regexp_replace(regexp_replace(query, '--[^\\n]*', '', 'g'), '\\s+', ' ', 'g'), 90), \
                calls::float8, \
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
    c.window.push(("statements", calls));
    c.window.push(("statement_server_us", ms * 1000.0));
    sqlx::query("SELECT pg_stat_statements_reset()")
        .execute(pool)
        .await?;
    Ok(c)
}

async fn redis_counters(conn: &mut redis::aio::ConnectionManager) -> Result<Counters, BenchError> {
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
    // Calls are what clients send (a script is one); commands count those run inside
    // scripts too, whose time is also inside the script's.
    let (mut calls, mut commands_run) = (0.0, 0.0);
    for (name, (n, usec)) in commands {
        if matches!(
            name.as_str(),
            "info" | "config|resetstat" | "dbsize" | "config"
        ) {
            continue;
        }
        if matches!(name.as_str(), "evalsha" | "eval" | "fcall") {
            calls += n as f64;
        } else {
            commands_run += n as f64;
        }
        c.items.push((name, n as f64, usec as f64 / 1000.0, 0.0));
    }
    c.window.push(("script_calls", calls));
    c.window
        .push(("commands_in_or_out_of_scripts", commands_run));
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async::<()>(conn)
        .await?;
    Ok(c)
}

/// The part's tables: one column per phase (the creation measured before the first drain),
/// then each phase's statements or commands.
pub(super) fn describe(v: &Value) -> String {
    let mut out = format!(
        "cost per job at the store — {} ({} jobs created with create_many, drained by one Worker of {} handlers)\n",
        v["backend"].as_str().unwrap_or("?"),
        v["jobs"],
        v["concurrency"]
    );
    let pg = v["backend"].as_str() == Some("postgres");
    let rows: Vec<&Value> = v["rows"].as_array().into_iter().flatten().collect();
    let Some(first) = rows.first() else {
        return out;
    };
    let mut columns: Vec<(String, &Value, &Value)> =
        vec![("create".into(), &first["create"], &first["create_top"])];
    for row in &rows {
        columns.push((
            format!("drain: {}", row["drain"].as_str().unwrap_or("?")),
            &row["per_job"],
            &row["top"],
        ));
    }
    out.push_str(&format!("  {:<30}", "per job"));
    for (name, _, _) in &columns {
        out.push_str(&format!(" {name:>24}"));
    }
    out.push('\n');
    let names: Vec<&String> = first["per_job"]
        .as_object()
        .map(|m| m.keys().collect())
        .unwrap_or_default();
    for name in names {
        out.push_str(&format!("  {name:<30}"));
        for (_, figures, _) in &columns {
            out.push_str(&format!(" {:>24.3}", figures[name].as_f64().unwrap_or(0.0)));
        }
        out.push('\n');
    }
    for (label, key) in [
        ("bench process CPU µs (drain)", "bench_process_us"),
        ("server processes CPU µs (drain)", "server_processes_us"),
    ] {
        out.push_str(&format!("  {label:<30} {:>24}", "—"));
        for row in &rows {
            out.push_str(&format!(
                " {:>24.1}",
                row["cpu"][key].as_f64().unwrap_or(0.0)
            ));
        }
        out.push('\n');
    }
    let wal: Vec<&Value> = std::iter::once(&first["create_wal"])
        .chain(rows.iter().map(|r| &r["wal"]))
        .collect();
    if wal.iter().any(|w| w.is_array()) {
        out.push_str(&format!("  {:<30}", "index_entries_written"));
        for w in &wal {
            out.push_str(&format!(" {:>24.3}", index_entries(w)));
        }
        out.push('\n');
    }
    for ((name, _, top), wal) in columns.iter().zip(&wal) {
        if let Some(records) = wal.as_array() {
            out.push_str(&format!("  {name}, WAL records (per job: count, bytes):\n"));
            for r in records.iter().take(8) {
                out.push_str(&format!(
                    "    {:>7.3} {:>8.1}  {}\n",
                    r["per_job"].as_f64().unwrap_or(0.0),
                    r["bytes_per_job"].as_f64().unwrap_or(0.0),
                    r["record"].as_str().unwrap_or("?")
                ));
            }
        }
        out.push_str(&format!(
            "  {name}, by {} (per job: calls, server µs{}):\n",
            if pg { "statement" } else { "command" },
            if pg { ", WAL bytes" } else { "" }
        ));
        for item in top.as_array().into_iter().flatten() {
            let wal = match pg {
                true => format!(" {:>8.1}", item["wal_bytes"].as_f64().unwrap_or(0.0)),
                false => String::new(),
            };
            out.push_str(&format!(
                "    {:>7.3} {:>8.1}{wal}  {}\n",
                item["calls"].as_f64().unwrap_or(0.0),
                item["server_us"].as_f64().unwrap_or(0.0),
                item["what"].as_str().unwrap_or("?")
            ));
        }
    }
    out
}

/// B-tree leaf inserts per job (one per index entry; `INSERT_POST` adds to a posting list).
fn index_entries(wal: &Value) -> f64 {
    wal.as_array()
        .into_iter()
        .flatten()
        .filter(|r| {
            matches!(
                r["record"].as_str(),
                Some("Btree/INSERT_LEAF" | "Btree/INSERT_POST")
            )
        })
        .map(|r| r["per_job"].as_f64().unwrap_or(0.0))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_costs_the_difference_of_running_totals_and_its_own_window() {
        let before = Counters {
            figures: vec![("wal_bytes", 1_000.0)],
            window: vec![("statements", 70.0)],
            ..Counters::default()
        };
        let after = Counters {
            figures: vec![("wal_bytes", 5_000.0)],
            window: vec![("statements", 8.0)],
            ..Counters::default()
        };
        let per = after.per_job(&before, 4);
        assert_eq!(per["wal_bytes"], json!(1_000.0));
        // The window was reset at the phase's start: the earlier reading is not subtracted.
        assert_eq!(per["statements"], json!(2.0));
    }

    #[test]
    fn index_entries_are_the_btree_leaf_inserts() {
        let wal = json!([
            {"record": "Btree/INSERT_LEAF", "per_job": 4.5},
            {"record": "Btree/INSERT_POST", "per_job": 0.5},
            {"record": "Btree/INSERT_UPPER", "per_job": 0.25},
            {"record": "Heap/UPDATE", "per_job": 2.0},
        ]);
        assert_eq!(index_entries(&wal), 5.0);
        assert_eq!(index_entries(&Value::Null), 0.0);
    }

    #[test]
    fn the_table_has_a_column_per_phase() {
        let v = json!({
            "backend": "redis", "jobs": 10, "concurrency": 64,
            "rows": [
                {"drain": "complete", "create": {"keys": 1.0}, "create_top": [],
                 "per_job": {"keys": 0.0}, "top": [{"what": "hget", "calls": 4.0, "server_us": 2.5}],
                 "create_wal": null, "wal": null},
                {"drain": "effect + complete", "create": {"keys": 1.0}, "create_top": [],
                 "per_job": {"keys": 1.0}, "top": [], "create_wal": null, "wal": null},
            ]
        });
        let text = describe(&v);
        let header = text.lines().nth(1).unwrap();
        for column in ["create", "drain: complete", "drain: effect + complete"] {
            assert!(header.contains(column), "{header}");
        }
        let keys = text
            .lines()
            .find(|l| l.trim_start().starts_with("keys"))
            .unwrap();
        let cells: Vec<&str> = keys.split_whitespace().collect();
        assert_eq!(cells, ["keys", "1.000", "0.000", "1.000"]);
        assert!(text.contains("    4.000      2.5  hget"), "{text}");
        assert!(!text.contains("WAL"), "Redis has no WAL column: {text}");
    }
}
