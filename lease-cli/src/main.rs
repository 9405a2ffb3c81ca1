//! `lease`: the fencing demo, operator commands, and the reference worker.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use distribution::{Config, ConfigError, Error, RunId, RunState, Ttl};

mod demo;
mod ledger;
mod metrics;
mod ops;
mod output;
mod pool;
mod worker;

/// Exit codes, documented in the README's CLI reference.
pub(crate) mod exit {
    /// Something failed that has no code of its own.
    pub(crate) const FAILURE: u8 = 1;
    /// Bad input: arguments, ids, URLs, configuration.
    pub(crate) const USAGE: u8 = 2;
    /// The run does not exist.
    pub(crate) const NOT_FOUND: u8 = 3;
    /// The store refused: held, delayed, suspended, completed, failed, stale fence, wrong state.
    pub(crate) const REFUSED: u8 = 4;
    /// The store could not be reached.
    pub(crate) const UNAVAILABLE: u8 = 5;
}

#[derive(Parser)]
#[command(
    name = "lease",
    version,
    about = "TTL leases on runs, guarded by fencing tokens"
)]
struct Cli {
    /// A TOML configuration file (keys: store, ttl_ms, heartbeat_ms, namespace, replicas,
    /// replica_timeout_ms, sync_replicas, max_connections).
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Store URL: memory:, postgres://… (or postgres://h1,h2/db), redis://…, rediss://…,
    /// redis+cluster://h1:p1,h2:p2, redis+sentinel://s1:p1,s2:p2/SERVICE [env: LEASE_STORE]
    #[arg(long, global = true, value_name = "URL")]
    store: Option<String>,
    /// Namespace: Postgres schema or Redis key prefix [env: LEASE_NAMESPACE]
    #[arg(long, global = true)]
    namespace: Option<String>,
    /// Lease TTL in milliseconds [env: LEASE_TTL_MS]
    #[arg(long, global = true, value_name = "MS")]
    ttl_ms: Option<u64>,
    /// Heartbeat interval in milliseconds; default TTL/3 [env: LEASE_HEARTBEAT_MS]
    #[arg(long, global = true, value_name = "MS")]
    heartbeat_ms: Option<u64>,
    /// Postgres pool size, 1 to 1000; default 10 [env: LEASE_MAX_CONNECTIONS]
    #[arg(long, global = true, value_name = "N")]
    max_connections: Option<u32>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the guarantee: a partitioned worker's late write is rejected by fence.
    Demo,
    /// Create a runnable run.
    Create {
        /// The run id.
        run: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show a run's record: state, owner, expiry on the store's clock, fence, heartbeats.
    Inspect {
        /// The run id.
        run: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// List runs, ordered by id, printing each page of 1,000 as it arrives (the store's work
    /// per call is bounded, so a long listing never stalls other clients). The table's columns
    /// widen when a later page has longer values; --json prints one JSON array, streamed
    /// element by element, which is valid only once the command succeeded.
    List {
        /// Only runs in this state: runnable, suspended, completed or failed.
        #[arg(long)]
        state: Option<RunState>,
        /// Only runs whose lease expired and was not reclaimed.
        #[arg(long)]
        expired: bool,
        /// At most this many runs in total (any number from 1).
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Make a suspended or failed run runnable again; its next claim takes a higher fence.
    Resume {
        /// The run id.
        run: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Take a run from its holder (administrative takeover). The next claim gets a higher fence,
    /// which fences the old holder out.
    Release {
        /// The run id.
        run: String,
        /// Required: this ignores the holder's fence.
        #[arg(long)]
        force: bool,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Retention: remove completed and failed runs that ended longer ago than --older-than,
    /// with their journals, oldest first, 1,000 per store call. Each leaves a tombstone with
    /// its last fence, so an id created again never reuses a fence.
    Purge {
        /// The age: a number and a unit, ms, s, m, h or d (for example 7d, 36h, 90s).
        #[arg(long, value_name = "AGE", value_parser = ops::parse_age)]
        older_than: Duration,
        /// Only count what would be removed.
        #[arg(long)]
        dry_run: bool,
        /// Print JSON instead of a sentence.
        #[arg(long)]
        json: bool,
    },
    /// Create or upgrade the Postgres schema.
    Migrate,
    /// Show the reference worker's side-effect ledger for a run.
    Ledger {
        /// The run id.
        run: String,
        /// Print JSON instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// The reference worker: claims a run, heartbeats it, and executes steps sent on stdin,
    /// printing one JSON event per line.
    Worker(worker::WorkerArgs),
}

/// A failure with the exit code it maps to and a one-sentence message.
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        let code = match &e {
            Error::NotFound { .. } => exit::NOT_FOUND,
            Error::Unavailable { .. } => exit::UNAVAILABLE,
            Error::InvalidInput(_) => exit::USAGE,
            Error::Backend { .. } => exit::FAILURE,
            Error::Misconfigured { .. } => exit::USAGE,
            _ => exit::REFUSED,
        };
        Failure {
            code,
            message: e.to_string(),
        }
    }
}

impl From<ConfigError> for Failure {
    fn from(e: ConfigError) -> Failure {
        match e {
            ConfigError::Store(e) => e.into(),
            other => Failure {
                code: exit::USAGE,
                message: other.to_string(),
            },
        }
    }
}

impl From<distribution::InvalidInput> for Failure {
    fn from(e: distribution::InvalidInput) -> Failure {
        Error::from(e).into()
    }
}

pub(crate) fn usage(message: impl Into<String>) -> Failure {
    Failure {
        code: exit::USAGE,
        message: message.into(),
    }
}

/// The configuration: defaults, then the file, then the environment, then flags.
fn config(cli: &Cli) -> Result<Config, Failure> {
    let mut config = Config::load(cli.config.as_deref())?;
    if let Some(store) = &cli.store {
        config = config.with_store(store.clone());
    }
    if let Some(ns) = &cli.namespace {
        config = config.with_namespace(ns.clone());
    }
    if let Some(ms) = cli.ttl_ms {
        config = config.with_ttl(Ttl::from_millis(ms)?);
    }
    if let Some(ms) = cli.heartbeat_ms {
        if ms == 0 {
            return Err(usage("--heartbeat-ms must be at least 1"));
        }
        config = config.with_heartbeat(Duration::from_millis(ms));
    }
    if let Some(n) = cli.max_connections {
        config = config.with_max_connections(n)?;
    }
    config.backend()?;
    Ok(config)
}

pub(crate) fn run_id(id: &str) -> Result<RunId, Failure> {
    Ok(RunId::new(id)?)
}

async fn dispatch(cli: Cli) -> Result<(), Failure> {
    let config = config(&cli)?;
    match cli.command {
        Command::Demo => demo::run(&config).await,
        Command::Create { run, json } => ops::create(&config, &run_id(&run)?, json).await,
        Command::Inspect { run, json } => ops::inspect(&config, &run_id(&run)?, json).await,
        Command::List {
            state,
            expired,
            limit,
            json,
        } => ops::list(&config, state, expired, limit, json).await,
        Command::Resume { run, json } => ops::resume(&config, &run_id(&run)?, json).await,
        Command::Release { run, force, json } => {
            if !force {
                return Err(usage(
                    "release without a lease needs --force: it takes the run from its holder",
                ));
            }
            ops::force_release(&config, &run_id(&run)?, json).await
        }
        Command::Purge {
            older_than,
            dry_run,
            json,
        } => ops::purge(&config, older_than, dry_run, json).await,
        Command::Migrate => ops::migrate(&config).await,
        Command::Ledger { run, json } => ops::ledger(&config, &run_id(&run)?, json).await,
        Command::Worker(args) => worker::run(&config, args).await,
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            // RUST_LOG (e.g. `RUST_LOG=lease_core=debug` for a span per store call), or the
            // older LEASE_LOG; errors only by default.
            tracing_subscriber::EnvFilter::try_from_env("RUST_LOG")
                .or_else(|_| tracing_subscriber::EnvFilter::try_from_env("LEASE_LOG"))
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lease: cannot start the async runtime: {e}");
            return ExitCode::from(exit::FAILURE);
        }
    };
    match runtime.block_on(dispatch(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("lease: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}
