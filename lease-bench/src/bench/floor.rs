//! The `floor` part (Postgres): the Worker's drain against the least a durable queue on the
//! same tables can do. Each of N raw loops claims 64 runs with the one statement a queue needs
//! (`UPDATE … WHERE run_id IN (SELECT … ORDER BY the claimable index LIMIT 64 FOR UPDATE
//! SKIP LOCKED)`: owner, expiry, fence) and ends them with one fenced `UPDATE … FROM unnest`:
//! two row versions per job and two commits per batch, nothing else (no attempt history, no
//! payload read, no lock that never waits, no journal). Against it, N Workers of 64 handlers
//! whose handler returns `End::Complete`, over a backlog of the same size, one after the other
//! in the same run. The ratio says how much of what the store can do the Worker gets; a peer
//! that writes the same two row versions per job cannot be ahead of the raw loops by more than
//! the loops' own lead over the Worker.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distribution::{
    BoxError, End, Ending, LeaseStore, RunContext, Ttl, Worker, WorkerConfig, WorkerId,
};
use serde_json::{json, Value};
use tokio::time::Instant;

use super::fleet::Fleet;
use super::raw::RawConn;
use super::sweep::{drop_namespace, quoted};
use super::worker::{create_backlog, job_names};
use super::{BenchError, Target};

/// Runs each raw loop claims per statement, and each Worker's handlers.
const BATCH: i64 = 64;

/// Both drains at each of `counts` loops / Workers, `jobs` runs each.
pub(super) async fn floor(
    target: &Target,
    jobs: usize,
    counts: &[usize],
) -> Result<Value, BenchError> {
    let RawConn::Pg(pool) = &target.raw else {
        return Err(BenchError::setup("the floor part measures Postgres"));
    };
    let mut rows = Vec::new();
    for &n in counts {
        let worker = drain(target, pool, jobs, n, Path::Worker).await?;
        let calls = drain(target, pool, jobs, n, Path::Calls).await?;
        let raw = drain(target, pool, jobs, n, Path::Raw).await?;
        eprintln!(
            "bench: floor at {n}: Worker {worker:.0} jobs/s, store calls {calls:.0}, raw loops {raw:.0}"
        );
        rows.push(json!({
            "count": n,
            "worker_jobs_per_s": worker,
            "calls_jobs_per_s": calls,
            "raw_jobs_per_s": raw,
            "ratio": worker / raw,
            "calls_ratio": calls / raw,
        }));
    }
    Ok(json!({"part": "floor", "jobs": jobs, "batch": BATCH, "rows": rows}))
}

/// Who drains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// `Worker`s of 64 handlers.
    Worker,
    /// Loops of the library's store calls alone: `claim_next(64)`, then `end_many` of them all
    /// with `End::Complete` (the Worker's statements, without its runtime).
    Calls,
    /// Loops of the two raw statements.
    Raw,
}

/// Jobs per second of one drain of `jobs` runs by `n` loops or Workers on `path`, checked:
/// every run completed. `pool` is the target's raw connection.
async fn drain(
    target: &Target,
    pool: &sqlx::PgPool,
    jobs: usize,
    n: usize,
    path: Path,
) -> Result<f64, BenchError> {
    let ns = target.namespace("floor");
    let lib = target.lib(&ns).await?;
    let names = job_names(jobs)?;
    create_backlog(&lib, &names).await?;
    let schema = quoted(&ns);
    sqlx::query(&format!("VACUUM ANALYZE {schema}.runs"))
        .execute(pool)
        .await?;
    let t0 = Instant::now();
    match path {
        Path::Raw => raw_loops(pool, &schema, n).await?,
        Path::Calls => call_loops(&lib, n).await?,
        Path::Worker => worker_fleet(&lib, jobs, n).await?,
    }
    let secs = t0.elapsed().as_secs_f64();
    let completed: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {schema}.runs WHERE state = 'completed'"
    ))
    .fetch_one(pool)
    .await?;
    if completed != jobs as i64 {
        return Err(BenchError::wrong(format!(
            "the {path:?} drain completed {completed} of {jobs} runs"
        )));
    }
    drop_namespace(target, &ns).await?;
    Ok(jobs as f64 / secs)
}

/// `n` Workers of 64 handlers (`End::Complete`) until all `jobs` runs are completed.
async fn worker_fleet(lib: &Arc<dyn LeaseStore>, jobs: usize, n: usize) -> Result<(), BenchError> {
    let mut fleet = Fleet::new(jobs);
    for w in 0..n {
        let config = WorkerConfig::new(Ttl::from_secs(30)?)
            .with_concurrency(BATCH as usize)
            .with_poll_interval(Duration::from_millis(10));
        let worker = fleet.counting(Worker::new(
            lib.clone(),
            WorkerId::new(format!("floor-worker-{w}"))?,
            config,
        )?);
        let shutdown = fleet.shutdown();
        let handler = |_: RunContext| async { Ok::<_, BoxError>(End::Complete) };
        fleet.spawn(async move { worker.run(handler, shutdown).await });
    }
    let waited = fleet.wait(Duration::from_secs(300)).await;
    fleet.stop().await?;
    if let Err(done) = waited {
        return Err(BenchError::wrong(format!(
            "{n} Workers completed {done} of {jobs} jobs"
        )));
    }
    Ok(())
}

/// `n` loops of claim 64 → end them, until the backlog is empty.
async fn raw_loops(pool: &sqlx::PgPool, schema: &str, n: usize) -> Result<(), BenchError> {
    let claim = format!(
        "UPDATE {schema}.runs r \
         SET lease_owner = $1, lease_expires_at = now() + interval '30 s', \
             claimable_at = now() + interval '30 s', fence = r.fence + 1, \
             attempts = r.attempts + 1, claimed_at = now() \
         WHERE r.run_id IN (SELECT run_id FROM {schema}.runs \
                            WHERE state = 'runnable' AND kind = 'default' AND priority = 0 \
                              AND queue = 'default' \
                              AND claimable_at <= now() AND lease_owner IS NULL \
                            ORDER BY kind, priority, queue, claimable_at, created_seq \
                            LIMIT {BATCH} FOR UPDATE SKIP LOCKED) \
         RETURNING r.run_id, r.fence"
    );
    let end = format!(
        "UPDATE {schema}.runs r \
         SET state = 'completed', lease_owner = NULL, lease_expires_at = NULL, \
             claimable_at = now() \
         FROM unnest($1::text[], $2::bigint[]) AS i(run_id, fence) \
         WHERE r.run_id = i.run_id AND r.fence = i.fence AND r.state = 'runnable' \
           AND r.lease_owner IS NOT NULL"
    );
    let empty = Arc::new(AtomicBool::new(false));
    let mut loops = tokio::task::JoinSet::new();
    for w in 0..n {
        let (pool, claim, end, empty) = (pool.clone(), claim.clone(), end.clone(), empty.clone());
        loops.spawn(async move {
            let owner = format!("floor-raw-{w}");
            while !empty.load(Ordering::Relaxed) {
                let rows: Vec<(String, i64)> = sqlx::query_as(&claim)
                    .bind(&owner)
                    .bind(BATCH)
                    .fetch_all(&pool)
                    .await?;
                if rows.is_empty() {
                    empty.store(true, Ordering::Relaxed);
                    break;
                }
                let (ids, fences): (Vec<String>, Vec<i64>) = rows.into_iter().unzip();
                // Every run is checked completed after the drain.
                sqlx::query(&end)
                    .bind(&ids)
                    .bind(&fences)
                    .execute(&pool)
                    .await?;
            }
            Ok::<_, sqlx::Error>(())
        });
    }
    while let Some(joined) = loops.join_next().await {
        joined.map_err(|e| BenchError::setup(format!("a raw loop failed: {e}")))??;
    }
    Ok(())
}

/// `n` loops of `claim_next(64)` → `end_many` of them all, until the backlog is empty.
async fn call_loops(lib: &Arc<dyn LeaseStore>, n: usize) -> Result<(), BenchError> {
    let mut loops = tokio::task::JoinSet::new();
    for w in 0..n {
        let lib = lib.clone();
        loops.spawn(async move {
            let owner = WorkerId::new(format!("floor-calls-{w}"))?;
            loop {
                let leases = lib
                    .claim_next(&owner, Ttl::from_secs(30)?, BATCH as usize)
                    .await?;
                if leases.is_empty() {
                    return Ok::<_, BenchError>(());
                }
                let mut ends: Vec<Ending> = leases
                    .into_iter()
                    .map(|lease| Ending::new(lease, End::Complete))
                    .collect();
                // An end skipped because another claim holds the row's lock for a moment (its
                // pick locked the row's newest version before rechecking it) is sent again, as
                // the Worker's batcher does.
                while !ends.is_empty() {
                    let verdicts = lib.end_many(&ends).await?;
                    let mut again = Vec::new();
                    for (ending, verdict) in ends.into_iter().zip(verdicts) {
                        match verdict {
                            Ok(()) => {}
                            Err(e) if e.is_retryable() => again.push(ending),
                            Err(e) => return Err(e.into()),
                        }
                    }
                    ends = again;
                }
            }
        });
    }
    while let Some(joined) = loops.join_next().await {
        joined.map_err(|e| BenchError::setup(format!("a loop of store calls failed: {e}")))??;
    }
    Ok(())
}

/// The table of the part.
pub(super) fn describe(v: &Value) -> String {
    let mut out = format!(
        "\nthe Worker against the floor — postgres ({} jobs per drain; loops claim {} and end them: through the store's calls, or with one raw UPDATE … SKIP LOCKED and one fenced UPDATE)\n  {:>6}  {:>14}  {:>14}  {:>14}  {:>12}  {:>12}\n",
        v["jobs"], v["batch"], "N", "Worker jobs/s", "calls jobs/s", "raw jobs/s", "Worker÷raw", "calls÷raw"
    );
    for row in v["rows"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "  {:>6}  {:>14.0}  {:>14.0}  {:>14.0}  {:>12.2}  {:>12.2}\n",
            row["count"],
            row["worker_jobs_per_s"].as_f64().unwrap_or(0.0),
            row["calls_jobs_per_s"].as_f64().unwrap_or(0.0),
            row["raw_jobs_per_s"].as_f64().unwrap_or(0.0),
            row["ratio"].as_f64().unwrap_or(0.0),
            row["calls_ratio"].as_f64().unwrap_or(0.0)
        ));
    }
    out
}
