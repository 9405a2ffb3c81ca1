//! `lease schedule NAME --every AGE | --cron EXPR`: enqueues one run per tick, `NAME@TICK`,
//! while this process holds the schedule's lease; start one on each of several hosts and
//! they take turns (see [`Scheduler`]).

use std::time::Duration;

use distribution::{connect, Backend, CancellationToken, Config, Schedule, Scheduler, WorkerId};
use lease_cli::{exit, usage, Failure};
use tokio::signal::unix::{signal, SignalKind};

use crate::ops::parse_age;

/// Arguments of `lease schedule`.
#[derive(clap::Args)]
pub(crate) struct ScheduleArgs {
    /// The schedule's name: each tick's run is NAME@UNIX_SECONDS.
    name: String,
    /// A tick every AGE, aligned to the Unix epoch (whole seconds: 1s, 5m, 1h, 1d).
    #[arg(long, value_name = "AGE", value_parser = parse_age, conflicts_with = "cron",
          required_unless_present = "cron")]
    every: Option<Duration>,
    /// A tick at each time EXPR matches, in UTC: five fields, or six with seconds first.
    #[arg(long, value_name = "EXPR")]
    cron: Option<String>,
    /// Each tick's run is created with this payload (at most 64 KiB).
    #[arg(long, value_name = "TEXT")]
    payload: Option<String>,
    /// Each tick's run is of this kind (only a worker serving it claims the run).
    #[arg(long, value_name = "KIND")]
    kind: Option<String>,
    /// A scheduler that takes the lease over enqueues missed ticks this far back; default
    /// twice the TTL plus a minute. Keep ended tick runs longer than this.
    #[arg(long, value_name = "AGE", value_parser = parse_age)]
    catch_up: Option<Duration>,
    /// The worker id recorded as the schedule lease's owner; default HOST:PID.
    #[arg(long = "id", value_name = "WORKER")]
    id: Option<String>,
}

/// The namespace of the schedules' leases beside `config`'s: its own, so that no worker
/// claiming jobs takes a schedule's lease for a job.
fn lease_namespace(config: &Config) -> String {
    format!(
        "{}_schedules",
        config.namespace.as_deref().unwrap_or("lease")
    )
}

/// Runs the scheduler until SIGINT or SIGTERM, then releases the lease and exits 0.
pub(crate) async fn schedule(config: &Config, args: ScheduleArgs) -> Result<(), Failure> {
    if config.backend()? == Backend::Memory {
        return Err(usage(
            "lease schedule enqueues runs for workers on other hosts and takes turns with the \
             schedulers there through a store they all share; memory: lives inside this one \
             process: name a shared store with --store or LEASE_STORE (postgres://, redis:// or \
             etcd://)",
        ));
    }
    let schedule = match (&args.every, &args.cron) {
        (Some(every), _) => Schedule::every(*every)?,
        (None, Some(expr)) => Schedule::cron(expr)?,
        (None, None) => return Err(usage("give --every AGE or --cron EXPR")),
    };
    Scheduler::check_name(&args.name)?;
    let kind = args
        .kind
        .as_deref()
        .map(distribution::Kind::new)
        .transpose()?;
    if let Some(payload) = &args.payload {
        // Refused before connecting, as `lease create` does.
        distribution::NewRun::new(lease_cli::run_id(&args.name)?)
            .with_payload(payload.as_bytes().to_vec())
            .check()?;
    }
    let worker = WorkerId::new(args.id.clone().unwrap_or_else(crate::run::default_worker))?;
    let ttl = config.ttl;
    let runs = connect(config).await?;
    let leases = connect(&config.clone().with_namespace(lease_namespace(config))).await?;
    let mut scheduler = Scheduler::new(runs, leases, &args.name, schedule, worker, ttl)?;
    if let Some(payload) = args.payload {
        scheduler = scheduler.with_payload(payload.into_bytes());
    }
    if let Some(kind) = kind {
        scheduler = scheduler.with_kind(kind);
    }
    if let Some(window) = args.catch_up {
        scheduler = scheduler.with_catch_up(window);
    }
    let shutdown = shutdown_on_signals()?;
    tracing::info!(schedule = %args.name, "scheduler started");
    let report = scheduler.run(shutdown).await?;
    eprintln!(
        "lease: schedule {} stopped: held its lease {} times, created {} tick runs ({} found created already)",
        args.name, report.held, report.created, report.existed
    );
    Ok(())
}

/// A token cancelled at the first SIGINT or SIGTERM.
pub(crate) fn shutdown_on_signals() -> Result<CancellationToken, Failure> {
    let shutdown = CancellationToken::new();
    let on = |kind: SignalKind| {
        signal(kind).map_err(|e| Failure {
            code: exit::FAILURE,
            message: format!("cannot install a signal handler: {e}"),
        })
    };
    let (mut int, mut term) = (on(SignalKind::interrupt())?, on(SignalKind::terminate())?);
    let stop = shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        stop.cancel();
    });
    Ok(shutdown)
}
