//! `lease-test-worker worker --pool N`: the library's `Worker` as a process. It claims runs up to N at a
//! time, runs each job (an optional pause, then its effect), ends every job's lease with its
//! effect in one write, group-committed, and prints one JSON line per lease end **after** the
//! store committed it. SIGINT or SIGTERM stop it gracefully: no new claims, running jobs get the
//! grace period, and what is still held is released for the next worker.

use std::time::Duration;

use distribution::{
    connect_store, CancellationToken, Config, End, EndReport, RunContext, Worker, WorkerConfig,
    WorkerId,
};
use serde_json::json;

use crate::worker::{rejection, Events};
use lease_cli::{usage, Failure};

/// The pool worker's settings.
#[derive(clap::Args)]
pub(crate) struct PoolArgs {
    /// Pool: flush the ends of leases when this many wait (1 to 1000).
    #[arg(long, value_name = "N", default_value_t = 100)]
    batch: usize,
    /// Pool: or this long after the first one started waiting.
    #[arg(long, value_name = "MS", default_value_t = 1)]
    batch_delay_ms: u64,
    /// Pool: at shutdown, how long running jobs may finish before their runs are released.
    #[arg(long, value_name = "MS", default_value_t = 5_000)]
    grace_ms: u64,
    /// Pool: the longest pause between polls while nothing is claimable.
    #[arg(long, value_name = "MS", default_value_t = 100)]
    poll_ms: u64,
    /// Pool: how long each job works before its effect (it stops early if its lease is lost).
    #[arg(long, value_name = "MS", default_value_t = 0)]
    job_ms: u64,
    /// Pool: retention by the fleet, purging ended runs older than this
    /// (`WorkerConfig::with_retention`).
    #[arg(long, value_name = "MS")]
    retention_ms: Option<u64>,
    /// Pool: with --retention-ms, look for runs to purge this often.
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 60_000,
        requires = "retention_ms"
    )]
    retention_every_ms: u64,
}

pub(crate) async fn run(
    config: &Config,
    worker: WorkerId,
    pool: usize,
    args: &PoolArgs,
    margin_ms: Option<u64>,
) -> Result<(), Failure> {
    let mut settings = WorkerConfig::new(config.ttl)
        .with_concurrency(pool)
        .with_batch(args.batch, Duration::from_millis(args.batch_delay_ms))
        .with_grace(Duration::from_millis(args.grace_ms))
        .with_poll_interval(Duration::from_millis(args.poll_ms));
    if let Some(hb) = config.heartbeat {
        settings = settings.with_heartbeat(hb);
    }
    if let Some(ms) = margin_ms {
        settings = settings.with_margin(Duration::from_millis(ms));
    }
    if let Some(ms) = args.retention_ms {
        settings = settings
            .with_retention(Duration::from_millis(ms))
            .with_retention_every(Duration::from_millis(args.retention_every_ms));
    }
    let events = Events::stdout();
    let store = connect_store(config).await?.as_dyn();
    let printer = events.clone();
    let runtime = Worker::new(store, worker.clone(), settings)
        .map_err(|e| usage(e.to_string()))?
        .on_end(move |end: &EndReport<'_>| {
            let base = json!({
                "run": end.lease.run().as_str(),
                "fence": end.lease.fence().get(),
                "end": end.end.as_str(),
                "by_handler": end.by_handler,
            });
            match end.result {
                Ok(()) => printer.emit("ended", base),
                Err(e) => {
                    let mut v = rejection(e);
                    v["run"] = base["run"].clone();
                    v["end"] = base["end"].clone();
                    printer.emit("end_failed", v)
                }
            }
        });
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone(), events.clone()));
    events.emit(
        "pool_started",
        json!({"worker": worker.as_str(), "concurrency": pool, "ttl_ms": config.ttl.as_millis()}),
    );
    let job = Duration::from_millis(args.job_ms);
    let name = worker.as_str().to_string();
    let report = runtime
        .run(
            move |ctx: RunContext| {
                let name = name.clone();
                async move {
                    if !job.is_zero() {
                        tokio::select! {
                            _ = ctx.cancelled() => return Err("cancelled before the job finished (lease lost, or the shutdown grace ended)".into()),
                            _ = tokio::time::sleep(job) => {}
                        }
                    }
                    Ok(End::CompleteWith(format!("{name} did {}", ctx.run()).into_bytes()))
                }
            },
            shutdown,
        )
        .await?;
    events.emit(
        "stopped",
        json!({
            "claimed": report.claimed, "completed": report.completed, "released": report.released,
            "refused": report.refused, "failed": report.failed, "abandoned": report.abandoned,
            "handler_errors": report.handler_errors, "gave_up": report.gave_up, "batches": report.batches,
            "purged": report.purged,
        }),
    );
    Ok(())
}

/// Cancels `shutdown` on SIGINT or SIGTERM.
async fn stop_on_signal(shutdown: CancellationToken, events: Events) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    events.emit("stopping", json!({}));
    shutdown.cancel();
}
