//! `lease worker [--kind K]… -- CMD [ARGS…]`: the library's [`Worker`] as a process, running
//! CMD once per run it claims, for a fleet whose jobs are programs rather than Rust handlers.
//!
//! Each command runs under its run's lease with the same safety rule as `lease run`: it is dead
//! before the lease can expire on the store's clock. The Worker's scopes cancel at their local
//! deadline, `send + TTL − margin`, with the margin [`min_margin`](distribution::min_margin)`(TTL)`
//! **plus the kill grace**; a cancelled scope (a lost lease, a cancel, the attempt's deadline,
//! the end of the shutdown's grace) sends SIGTERM to the command's process group and SIGKILL
//! one kill grace later. If the handler is dropped (the Worker aborts one that outlived its
//! grace), the group is killed as it goes.
//!
//! An exit 0 completes the run; any other exit is a failed attempt, retried with the Worker's
//! backoff or failed at `--max-attempts`, the exit code in the attempt's error.

use std::ffi::OsString;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use distribution::{
    connect, observe, Backend, BoxError, Config, End, Kind, Kinds, RetryPolicy, RunContext, Worker,
    WorkerConfig, WorkerId,
};
use lease_cli::{usage, without_store_env, Failure};
use rustix::process::{kill_process_group, Pid, Signal};
use tokio::io::AsyncWriteExt;

/// Arguments of `lease worker`.
#[derive(clap::Args)]
pub(crate) struct WorkerArgs {
    /// Serve the runs of this kind; repeat it for several kinds (taken in turn). Default: the
    /// kind `default`, the kind of runs created without one.
    #[arg(long = "kind", value_name = "KIND")]
    kinds: Vec<String>,
    /// Serve the runs of this queue, QUEUE or QUEUE=N (at most N of its commands at once,
    /// within --concurrency); repeat it for several queues (taken in turn). Default: the
    /// queue `default`, the queue of runs created without one. A paused queue (`lease queue
    /// pause`) is passed by until it is resumed.
    #[arg(long = "queue", value_name = "QUEUE[=N]")]
    queues: Vec<String>,
    /// How many commands run at once.
    #[arg(long, value_name = "N", default_value_t = 1)]
    concurrency: usize,
    /// The attempt budget: a run whose command failed N times (non-zero exits, timeouts,
    /// lost leases, crashes) is failed instead of run again. Default 25.
    #[arg(long, value_name = "N")]
    max_attempts: Option<u64>,
    /// Each command's deadline: SIGTERM after MS milliseconds, SIGKILL one kill grace later;
    /// the attempt counts as failed. Off by default.
    #[arg(long, value_name = "MS")]
    attempt_timeout_ms: Option<u64>,
    /// The grace between SIGTERM and SIGKILL, in milliseconds; less than half the TTL.
    /// Default TTL/10.
    #[arg(long, value_name = "MS")]
    kill_after_ms: Option<u64>,
    /// At SIGINT or SIGTERM, how long the running commands get to finish before they are
    /// stopped and their runs given back (a number and a unit, ms, s, m or h). Default 10s.
    #[arg(long, value_name = "AGE", value_parser = crate::ops::parse_age)]
    grace: Option<Duration>,
    /// Retention by the fleet: purge ended runs older than AGE whatever their state, taking
    /// turns with the store's other purgers under one lease. By default completed runs are
    /// purged 24h after they ended, failed and cancelled ones after 7 days.
    #[arg(long, value_name = "AGE", value_parser = crate::ops::parse_age, conflicts_with = "no_retention")]
    retention: Option<Duration>,
    /// Keep every ended run: this worker purges nothing.
    #[arg(long)]
    no_retention: bool,
    /// Serve the library's metrics in Prometheus text format on this address (for example
    /// 127.0.0.1:9464; port 0 picks a free one). The address is printed on stderr.
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<String>,
    /// With --metrics-addr: refresh the store's counts gauges (runs by state and kind, the
    /// queue's lag) every AGE. One process of the fleet is enough.
    #[arg(long, value_name = "AGE", value_parser = crate::ops::parse_age, requires = "metrics_addr")]
    counts_every: Option<Duration>,
    /// The worker id recorded as the owner of the leases; default HOST:PID.
    #[arg(long = "id", value_name = "WORKER")]
    id: Option<String>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<OsString>,
}

/// Runs the worker until SIGINT or SIGTERM; then lets the commands finish for the grace,
/// stops the rest, gives their runs back, prints what it did on stderr and returns.
pub(crate) async fn worker(config: &Config, args: WorkerArgs) -> Result<(), Failure> {
    if config.backend()? == Backend::Memory {
        return Err(usage(
            "lease worker serves the runs of a store other processes create runs in; memory: \
             lives inside this one process, so it would never see one: name a shared store \
             with --store or LEASE_STORE (postgres://, redis:// or etcd://)",
        ));
    }
    let timing = crate::run::timing(
        config.ttl.as_duration(),
        args.kill_after_ms,
        config.heartbeat,
    )?;
    let mut retry = RetryPolicy::default();
    if let Some(n) = args.max_attempts {
        if n == 0 {
            return Err(usage("--max-attempts must be at least 1"));
        }
        retry = retry.with_max_attempts(n);
    }
    let mut worker_config = WorkerConfig::new(config.ttl)
        .with_concurrency(args.concurrency)
        .with_heartbeat(timing.heartbeat)
        .with_margin(timing.margin)
        .with_retry(retry);
    if let Some(ms) = args.attempt_timeout_ms {
        worker_config = worker_config.with_attempt_timeout(Duration::from_millis(ms));
    }
    if let Some(grace) = args.grace {
        worker_config = worker_config.with_grace(grace);
    }
    if let Some(age) = args.retention {
        worker_config = worker_config.with_retention(age);
    }
    if args.no_retention {
        worker_config = worker_config.with_retention_policy(None);
    }
    for queue in &args.queues {
        let (name, limit) = match queue.rsplit_once('=') {
            Some((name, n)) => {
                let n = n.parse::<usize>().map_err(|_| {
                    usage(format!(
                        "--queue {queue}: the limit after '=' must be a whole number"
                    ))
                })?;
                (name, Some(n))
            }
            None => (queue.as_str(), None),
        };
        worker_config = worker_config.with_queue(distribution::Queue::new(name)?, limit);
    }
    worker_config.check()?;
    let kinds = if args.kinds.is_empty() {
        vec![Kind::default()]
    } else {
        args.kinds
            .iter()
            .map(|k| Kind::new(k.as_str()))
            .collect::<Result<Vec<_>, _>>()?
    };
    for (i, kind) in kinds.iter().enumerate() {
        if kinds[..i].contains(kind) {
            return Err(usage(format!("--kind {kind} is given twice")));
        }
        if kind.as_str() == distribution::PURGER_KIND && !args.no_retention {
            return Err(usage(format!(
                "--kind {kind} is the purge lease's kind: a worker with retention (the \
                 default; --no-retention turns it off) does not serve it"
            )));
        }
    }
    let id = WorkerId::new(args.id.unwrap_or_else(crate::run::default_worker))?;
    let command: Arc<[OsString]> = args.command.into();
    let kill_grace = timing.grace;
    let mut routes = Kinds::new();
    for kind in kinds {
        let command = command.clone();
        routes = routes.handle(kind, move |ctx: RunContext| {
            let command = command.clone();
            async move { run_command(&command, ctx, kill_grace).await }
        });
    }
    if let Some(addr) = &args.metrics_addr {
        let bound = lease_cli::metrics::serve("--metrics-addr", addr).await?;
        eprintln!("lease: serving metrics on http://{bound}/metrics");
    }
    let store = connect(config).await?;
    let worker = Worker::new(store.clone(), id.clone(), worker_config)?;
    let _counts = args
        .counts_every
        .map(|every| observe::spawn_counts(store, every));
    let shutdown = crate::schedule::shutdown_on_signals()?;
    tracing::info!(worker = %id, "lease worker started");
    let report = worker.run_kinds(routes, shutdown).await?;
    eprintln!(
        "lease: worker {id} stopped: claimed {}, completed {}, released {}, commands failed {}, \
         runs failed {}, timed out {}, lost {}",
        report.claimed,
        report.completed,
        report.released,
        report.handler_errors,
        report.gave_up,
        report.timed_out,
        report.refused
    );
    Ok(())
}

/// Runs the command for one claimed run: `LEASE_RUN`, `LEASE_FENCE`, `LEASE_KIND` and
/// `LEASE_ATTEMPT` in its environment (the worker's own, less the store's settings), the
/// run's payload on its standard input (empty without one). Exit 0 completes the run; anything else fails the attempt.
async fn run_command(
    command: &[OsString],
    ctx: RunContext,
    kill_grace: Duration,
) -> Result<End, BoxError> {
    let mut process = tokio::process::Command::new(&command[0]);
    without_store_env(&mut process)
        .args(&command[1..])
        .env("LEASE_RUN", ctx.run().as_str())
        .env("LEASE_FENCE", ctx.fence().get().to_string())
        .env("LEASE_KIND", ctx.kind().as_str())
        .env("LEASE_ATTEMPT", ctx.attempt().to_string())
        .stdin(if ctx.payload().is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .process_group(0);
    let mut child = process.spawn().map_err(|e| {
        format!(
            "cannot start {}: {e}",
            command[0].to_string_lossy().escape_debug()
        )
    })?;
    let group = Group(child.id().and_then(|id| Pid::from_raw(id as i32)));
    if let (Some(payload), Some(mut stdin)) = (ctx.payload(), child.stdin.take()) {
        let payload = payload.to_vec();
        // A command that never reads its input must not hold its run up: written aside, and
        // a closed pipe is fine.
        tokio::spawn(async move {
            let _ = stdin.write_all(&payload).await;
        });
    }
    tracing::info!(run = %ctx.run(), fence = %ctx.fence(), "starting the command");
    tokio::select! {
        status = child.wait() => {
            let status = status.map_err(|e| format!("cannot wait for the command: {e}"))?;
            if status.success() {
                Ok(End::Complete)
            } else {
                Err(format!("the command exited with {}", crate::run::exit_code(status)).into())
            }
        }
        () = ctx.cancelled() => {
            group.signal(Signal::TERM);
            let how = tokio::select! {
                _ = child.wait() => "SIGTERM",
                () = tokio::time::sleep(kill_grace) => {
                    group.signal(Signal::KILL);
                    let _ = child.wait().await;
                    "SIGKILL"
                }
            };
            Err(format!(
                "the command was stopped with {how}: its lease's scope was cancelled (a lost \
                 lease, a cancel, the attempt's deadline or the shutdown)"
            )
            .into())
        }
    }
    // `group` is dropped here (and if this future is dropped): what the command left in its
    // group runs under the lease no longer.
}

/// A command's process group, killed when dropped.
struct Group(Option<Pid>);

impl Group {
    fn signal(&self, signal: Signal) {
        if let Some(group) = self.0 {
            let _ = kill_process_group(group, signal);
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.signal(Signal::KILL);
    }
}
