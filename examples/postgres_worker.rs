//! A worker service on Postgres: each job's effect and its completion commit in **one fenced
//! transaction**, and the service shuts down gracefully on SIGTERM or Ctrl-C.
//!
//! ```sh
//! DATABASE_URL=postgres://app@localhost/shop cargo run -p distribution --example postgres_worker
//! ```
//!
//! What it does:
//!
//! 1. Connects from a [`Config`]: the store URL is `LEASE_STORE`, or else `DATABASE_URL`;
//!    the other `LEASE_*` variables apply too (`LEASE_TTL_MS`, `LEASE_NAMESPACE`, …). The
//!    leases live in the schema `example_worker` unless `LEASE_NAMESPACE` says otherwise.
//! 2. Creates the application's own table, `example_payments`, and enqueues a batch of runs
//!    (`payment-<batch>-<n>`, a fresh batch each start).
//! 3. Runs the library's [`Worker`]. Its handler does the job's "work", then opens a
//!    [`fenced_transaction`](distribution::postgres::PostgresLeaseStore::fenced_transaction)
//!    (which locks the run's row and checks the lease's fence), inserts the payment row, and
//!    completes the lease **in the same transaction**: the payment exists if and only if the run
//!    is completed, so a worker that dies before the commit leaves nothing behind, and a run is
//!    never paid twice, whatever crashes or reclaims happen.
//! 4. Stops when the queue is drained (including runs an earlier, interrupted start left), or
//!    at SIGTERM / SIGINT: it stops claiming, lets running jobs finish within the grace period,
//!    releases what it still holds, and leaves the rest runnable for the next worker.
//! 5. Checks what it claims, and exits non-zero if it does not hold: no run has two payments;
//!    every completed run of its batch has exactly one, written under the fence of the lease
//!    that completed it; every other run of the batch is runnable, unowned and unpaid.
//!
//! It prints `ready: …` once the first payments committed (scripts/test.sh waits for that line
//! and sends SIGTERM), and `stopped by SIGTERM` or `stopped: queue drained` at the end.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use distribution::postgres::{sqlx, PostgresLeaseStore};
use distribution::{
    connect_store, CancellationToken, Config, End, Ended, LeaseStore, RunContext, RunId, RunState,
    Store, Worker, WorkerConfig, WorkerId,
};

/// Runs per start.
const RUNS: usize = 40;
/// Handlers at once.
const CONCURRENCY: usize = 4;
/// How long a job "works" before it writes its effect.
const WORK: Duration = Duration::from_millis(50);
/// How many payments commit before the `ready` line.
const READY_AFTER: u64 = 4;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> ExitCode {
    match serve().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("postgres_worker: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve() -> Result<(), BoxError> {
    // Install the signal handlers first: a SIGTERM that comes before them would kill the
    // process instead of shutting it down.
    let signals = Signals::install()?;

    // --- connect ---------------------------------------------------------------------------
    let mut config = Config::load(None)?; // defaults, then the LEASE_* variables
    if std::env::var_os("LEASE_STORE").is_none() {
        let url = std::env::var("DATABASE_URL")
            .map_err(|_| "set DATABASE_URL (or LEASE_STORE) to a postgres:// URL")?;
        config = config.with_store(url);
    }
    if config.namespace.is_none() {
        config = config.with_namespace("example_worker");
    }
    let store = connect_store(&config).await?;
    let Store::Postgres(pg) = &store else {
        return Err(format!("this example needs a postgres:// store, not {config}").into());
    };
    let pg: Arc<PostgresLeaseStore> = pg.clone();
    // The backend-neutral, instrumented store for the Worker; `pg` for fenced transactions.
    let leases: Arc<dyn LeaseStore> = store.as_dyn();

    // --- the application's table and the batch ---------------------------------------------
    // (run_id, fence) is the key, not run_id alone: a double execution would be two rows with
    // two fences, which is what the check at the end looks for.
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS example_payments (
             run_id TEXT NOT NULL,
             fence BIGINT NOT NULL,
             worker TEXT NOT NULL,
             paid_at TIMESTAMPTZ NOT NULL DEFAULT now(),
             PRIMARY KEY (run_id, fence))",
    )
    .execute(pg.pool())
    .await?;
    let millis = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    let batch = format!("{millis:x}-{}", std::process::id());
    let ids: Vec<RunId> = (0..RUNS)
        .map(|n| RunId::new(format!("payment-{batch}-{n:03}")))
        .collect::<Result<_, _>>()?;
    for created in leases.create_many(&ids).await? {
        created?;
    }
    let worker_id = WorkerId::new(format!("worker-{}", std::process::id()))?;
    println!("started: {worker_id}, batch {batch} of {RUNS} runs, on {config}");

    // --- the worker ------------------------------------------------------------------------
    let shutdown = CancellationToken::new();
    let paid = Arc::new(AtomicU64::new(0));
    let worker_config = WorkerConfig::new(config.ttl)
        .with_concurrency(CONCURRENCY)
        .with_grace(Duration::from_secs(2));
    let worker = Worker::new(leases.clone(), worker_id.clone(), worker_config)?.on_end({
        let paid = paid.clone();
        move |end| match end.result {
            // Called after the store decided: the payment and the completion are committed.
            Ok(()) if matches!(end.end, End::Committed(Ended::Completed)) => {
                if paid.fetch_add(1, Ordering::Relaxed) + 1 == READY_AFTER {
                    println!("ready: {READY_AFTER} payments committed");
                }
            }
            Ok(()) => {}
            Err(e) => eprintln!("{} not ended: {e}", end.lease.run()),
        }
    });

    let handler = {
        let pg = pg.clone();
        let worker_id = worker_id.clone();
        move |ctx: RunContext| {
            let (pg, worker_id) = (pg.clone(), worker_id.clone());
            async move {
                // The job's work. The token is cancelled if the lease may be lost, or when the
                // shutdown's grace period is over: stop, and the Worker releases the run.
                tokio::select! {
                    _ = ctx.cancelled() => return Ok(End::Release),
                    _ = tokio::time::sleep(WORK) => {}
                }
                // The effect and the completion in one transaction, under the fence: the row
                // lock keeps any reclaim out until the commit, and a stale lease is refused
                // (StaleFence) before anything is written.
                let lease = ctx.lease();
                let mut tx = pg.fenced_transaction(&lease).await?;
                sqlx::query(
                    "INSERT INTO example_payments (run_id, fence, worker) VALUES ($1, $2, $3)",
                )
                .bind(lease.run().as_str())
                .bind(i64::try_from(lease.fence().get())?)
                .bind(worker_id.as_str())
                .execute(&mut *tx)
                .await?;
                tx.complete().await?;
                // Already committed: the Worker checks the store shows it and writes nothing.
                Ok::<_, BoxError>(End::Committed(Ended::Completed))
            }
        }
    };

    let stop = tokio::spawn(stop_when(leases.clone(), signals, shutdown.clone()));
    let report = worker.run(handler, shutdown.clone()).await?;
    shutdown.cancel(); // if the worker returned on its own (a fatal store error)
    let why = stop.await??;
    println!(
        "{why}: completed {}, released {}, handler errors {}, refused {}",
        report.completed, report.released, report.handler_errors, report.refused
    );

    // --- check what the example promises ---------------------------------------------------
    let doubles: Vec<(String, i64)> = sqlx::query_as(
        "SELECT run_id, count(*) FROM example_payments GROUP BY run_id HAVING count(*) > 1",
    )
    .fetch_all(pg.pool())
    .await?;
    if !doubles.is_empty() {
        return Err(format!("runs paid more than once: {doubles:?}").into());
    }
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT run_id, fence FROM example_payments WHERE run_id LIKE $1")
            .bind(format!("payment-{batch}-%"))
            .fetch_all(pg.pool())
            .await?;
    let payments: HashMap<String, i64> = rows.into_iter().collect();
    let (mut completed, mut left) = (0, 0);
    for record in leases.inspect_many(&ids).await? {
        let record = record?;
        let payment = payments.get(record.run.as_str()).copied();
        match record.state {
            RunState::Completed if payment == i64::try_from(record.fence.get()).ok() => {
                completed += 1
            }
            RunState::Runnable if record.owner.is_none() && payment.is_none() => left += 1,
            state => {
                return Err(format!(
                    "{} is {state} (owner {:?}, fence {}) with payment under fence {payment:?}",
                    record.run, record.owner, record.fence
                )
                .into())
            }
        }
    }
    if why == STOPPED_DRAINED && left > 0 {
        return Err(format!("the queue drained but {left} runs of the batch are not done").into());
    }
    println!(
        "ok: {completed} runs of this batch paid once each, under their completion's fence; \
         {left} left runnable for the next worker; no run paid twice"
    );
    Ok(())
}

const STOPPED_DRAINED: &str = "stopped: queue drained";

/// Cancels `shutdown` at SIGTERM or SIGINT, or once nothing is left to claim or finish.
async fn stop_when(
    store: Arc<dyn LeaseStore>,
    signals: Signals,
    shutdown: CancellationToken,
) -> Result<&'static str, BoxError> {
    let drained = async {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            // Runnable runs of every kind but the purge lease's: the fleet's purger (on by
            // default) holds that run for as long as a worker runs.
            let runnable: u64 = store
                .count_kinds()
                .await?
                .iter()
                .filter(|k| k.kind.as_str() != distribution::PURGER_KIND)
                .map(|k| k.runnable)
                .sum();
            if runnable == 0 {
                return Ok::<_, BoxError>(STOPPED_DRAINED);
            }
        }
    };
    let why = tokio::select! {
        signal = signals.recv() => signal,
        why = drained => why?,
        // The worker returned by itself.
        _ = shutdown.cancelled() => "stopped",
    };
    shutdown.cancel();
    Ok(why)
}

/// SIGTERM (what a service manager or Kubernetes sends) and SIGINT (Ctrl-C).
struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers now (not at the first poll).
    fn install() -> std::io::Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Signals {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    async fn recv(mut self) -> &'static str {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.term.recv() => "stopped by SIGTERM",
                _ = self.int.recv() => "stopped by SIGINT",
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            "stopped by Ctrl-C"
        }
    }
}
