//! The `pickup` part: how long a run created on an idle fleet waits for its handler, and what
//! an idle fleet costs the store, with the store's wake-ups (the default) against polling
//! (`without_wake_ups`, backing off to the default 100 ms), in the same run.
//!
//! Each Worker has a store of its own, as a process of a fleet would (so with wake-ups, one
//! listening session each). A run's latency is from just before its `create` call to its
//! handler's start; runs are created one at a time, spaced so every worker is idle again. The
//! idle load is the `claim_next` calls that found nothing, per worker per second, over a quiet
//! window in which nothing is created.

use std::sync::Arc;
use std::time::Duration;

use distribution::{
    CancellationToken, LeaseStore, RunId, Ttl, WorkerConfig, WorkerId, WorkerReport,
};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::sweep::drop_namespace;
use super::{BenchError, Kind, Target};

/// Connections of each worker's Postgres store: an idle worker needs few, and 16 stores must fit
/// the fixture's connection limit.
const POOL: u32 = 4;

/// How a fleet waits when it has nothing to do.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Wake,
    Poll,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Wake => "wake-ups",
            Mode::Poll => "polling",
        }
    }
}

async fn store(target: &Target, ns: &str) -> Result<Arc<dyn LeaseStore>, BenchError> {
    Ok(match target.kind {
        Kind::Postgres => Arc::new(
            distribution::postgres::PostgresLeaseStore::connect(
                distribution::postgres::PostgresConfig::from_url(&target.url)
                    .with_schema(ns)
                    .with_max_connections(POOL)
                    .with_acquire_timeout(Duration::from_secs(60)),
            )
            .await?,
        ),
        Kind::Redis => target.lib(ns).await?,
    })
}

struct Fleet {
    shutdown: CancellationToken,
    workers: Vec<JoinHandle<distribution::Result<WorkerReport>>>,
    started: mpsc::UnboundedReceiver<(RunId, Instant)>,
    /// The first store, to create runs through.
    creator: Arc<dyn LeaseStore>,
}

async fn fleet(target: &Target, ns: &str, n: usize, mode: Mode) -> Result<Fleet, BenchError> {
    let shutdown = CancellationToken::new();
    let (tx, started) = mpsc::unbounded_channel();
    let mut workers = Vec::with_capacity(n);
    let mut creator = None;
    for i in 0..n {
        let store = store(target, ns).await?;
        creator.get_or_insert_with(|| store.clone());
        let mut config = WorkerConfig::new(Ttl::from_secs(30)?);
        if mode == Mode::Poll {
            config = config.without_wake_ups();
        }
        workers.push(lease_conformance::spawn_reporting_worker(
            store,
            WorkerId::new(format!("pickup-{i}"))?,
            config,
            tx.clone(),
            shutdown.clone(),
        )?);
    }
    let creator = creator.ok_or_else(|| BenchError::setup("a fleet of no workers"))?;
    Ok(Fleet {
        shutdown,
        workers,
        started,
        creator,
    })
}

impl Fleet {
    async fn stop(self) -> Result<Vec<WorkerReport>, BenchError> {
        self.shutdown.cancel();
        let mut reports = Vec::new();
        for w in self.workers {
            reports.push(
                w.await
                    .map_err(|e| BenchError::setup(format!("worker task: {e}")))??,
            );
        }
        Ok(reports)
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

/// One fleet of `n` workers in `mode`: the idle load over `quiet`, then `runs` pickups.
async fn measure(
    target: &Target,
    n: usize,
    mode: Mode,
    runs: usize,
    quiet: Duration,
) -> Result<Value, BenchError> {
    let ns = target.namespace(&format!("pickup_{n}_{}", mode.name().replace('-', "")));
    let mut fleet = fleet(target, &ns, n, mode).await?;
    // Settle: the stores connect, their listeners subscribe, the first claims find nothing and
    // the polling ones back off to their interval.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let mut latencies_ms = Vec::with_capacity(runs);
    for i in 0..runs {
        let id = RunId::new(format!("pickup-{i:04}"))?;
        let sent = Instant::now();
        fleet.creator.create(&id).await?;
        let (ran, at) = tokio::time::timeout(Duration::from_secs(30), fleet.started.recv())
            .await
            .map_err(|_| BenchError::wrong(format!("{id} not started within 30 s")))?
            .ok_or_else(|| BenchError::wrong("the fleet stopped"))?;
        if ran != id {
            return Err(BenchError::wrong(format!("started {ran}, expected {id}")));
        }
        latencies_ms.push((at - sent).as_secs_f64() * 1000.0);
        // Every worker idle again, and into its longest backoff.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let reports = fleet.stop().await?;
    let completed: u64 = reports.iter().map(|r| r.completed).sum();
    if completed != runs as u64 {
        return Err(BenchError::wrong(format!(
            "{completed} of {runs} pickups completed"
        )));
    }
    let wake_ups: u64 = reports.iter().map(|r| r.wake_ups).sum();
    drop_namespace(target, &ns).await?;

    let idle = idle_load(target, n, mode, quiet).await?;
    latencies_ms.sort_by(f64::total_cmp);
    Ok(json!({
        "workers": n,
        "mode": mode.name(),
        "runs": runs,
        "p50_ms": percentile(&latencies_ms, 0.5),
        "p90_ms": percentile(&latencies_ms, 0.9),
        "p99_ms": percentile(&latencies_ms, 0.99),
        "max_ms": latencies_ms.last().copied().unwrap_or(0.0),
        "wake_ups": wake_ups,
        "idle_claims_per_worker_s": idle,
    }))
}

/// Empty claims per worker per second of a fleet that is only idle for `quiet` (after 2 s to
/// settle, which are not counted: the reports' totals of a settle-only fleet are subtracted).
async fn idle_load(
    target: &Target,
    n: usize,
    mode: Mode,
    quiet: Duration,
) -> Result<f64, BenchError> {
    let settle = Duration::from_secs(2);
    let mut polls = [0u64; 2];
    for (slot, window) in [(0, settle), (1, settle + quiet)] {
        let ns = target.namespace(&format!("idle_{n}_{}", mode.name().replace('-', "")));
        let fleet = fleet(target, &ns, n, mode).await?;
        tokio::time::sleep(window).await;
        let reports = fleet.stop().await?;
        polls[slot] = reports.iter().map(|r| r.empty_polls).sum();
        drop_namespace(target, &ns).await?;
    }
    let extra = polls[1].saturating_sub(polls[0]) as f64;
    Ok(extra / n as f64 / quiet.as_secs_f64())
}

/// Pickup latency and idle load with 1 and 16 workers, wake-ups against polling.
pub(crate) async fn pickup(target: &Target, quick: bool) -> Result<Value, BenchError> {
    let runs = if quick { 20 } else { 40 };
    let quiet = Duration::from_secs(if quick { 5 } else { 10 });
    let mut rows = Vec::new();
    for n in [1, 16] {
        for mode in [Mode::Wake, Mode::Poll] {
            eprintln!(
                "bench: {} pickup, {n} idle workers, {}",
                target.kind.name(),
                mode.name()
            );
            rows.push(measure(target, n, mode, runs, quiet).await?);
        }
    }
    let ratio = |n: usize, field: &str| {
        let of = |mode: Mode| {
            rows.iter()
                .find(|r| r["workers"] == n && r["mode"] == mode.name())
                .and_then(|r| r[field].as_f64())
                .unwrap_or(0.0)
        };
        of(Mode::Wake) / of(Mode::Poll).max(f64::MIN_POSITIVE)
    };
    let ratios = json!({
        "p50_wake_over_poll_1": ratio(1, "p50_ms"),
        "p50_wake_over_poll_16": ratio(16, "p50_ms"),
        "idle_wake_over_poll_1": ratio(1, "idle_claims_per_worker_s"),
        "idle_wake_over_poll_16": ratio(16, "idle_claims_per_worker_s"),
    });
    Ok(json!({
        "part": "pickup",
        "backend": target.kind.name(),
        "rows": rows,
        "ratios": ratios,
    }))
}

/// The pickup rows as a table.
pub(crate) fn describe(v: &Value) -> String {
    let mut out = format!(
        "{} pickup (create → handler start; idle = empty claims per worker per second)\n",
        v["backend"].as_str().unwrap_or("?")
    );
    out.push_str("  workers  mode       p50 ms   p90 ms   p99 ms   max ms   idle/s\n");
    for r in v["rows"].as_array().into_iter().flatten() {
        let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
        out.push_str(&format!(
            "  {:>7}  {:<9} {:>7.1}  {:>7.1}  {:>7.1}  {:>7.1}  {:>7.2}\n",
            r["workers"].as_u64().unwrap_or(0),
            r["mode"].as_str().unwrap_or("?"),
            f("p50_ms"),
            f("p90_ms"),
            f("p99_ms"),
            f("max_ms"),
            f("idle_claims_per_worker_s"),
        ));
    }
    out
}
