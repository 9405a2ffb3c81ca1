//! What the `lease` command shares with `lease-test-worker`, the test-support binary of the
//! whole-system tests: exit codes, failures that carry one, the store flags, and the process
//! entry point.
//!
//! Not a library for users: the `lease` command is the interface, and this crate's API may
//! change with it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use distribution::{Config, ConfigError, Error, RunId, Ttl};

pub mod metrics;

/// Exit codes, documented in the command reference of `lease-cli/README.md`.
pub mod exit {
    /// Something failed that has no code of its own.
    pub const FAILURE: u8 = 1;
    /// Bad input: arguments, ids, URLs, configuration.
    pub const USAGE: u8 = 2;
    /// The run does not exist.
    pub const NOT_FOUND: u8 = 3;
    /// The store refused: held, delayed, suspended, completed, failed, stale fence, wrong state.
    pub const REFUSED: u8 = 4;
    /// The store could not be reached.
    pub const UNAVAILABLE: u8 = 5;
    /// `lease run`: the lease was lost (a renewal was refused, or the local deadline passed
    /// without one) and the command was stopped before the lease could expire on the store's
    /// clock.
    pub const LEASE_LOST: u8 = 6;
    /// `lease run`: the command outlived `--attempt-timeout-ms` and was stopped (as GNU
    /// `timeout` reports it); the run was given back with the attempt counted.
    pub const ATTEMPT_TIMEOUT: u8 = 124;
    /// `lease run`: the command could not be started because it was not found (as in a shell).
    pub const COMMAND_NOT_FOUND: u8 = 127;
    /// `lease run`: the command was found but could not be started (as in a shell).
    pub const COMMAND_NOT_STARTED: u8 = 126;
}

/// A failure with the exit code it maps to and a one-sentence message.
#[derive(Debug)]
pub struct Failure {
    /// The process exit code, one of [`exit`].
    pub code: u8,
    /// One sentence for stderr, without the program's name.
    pub message: String,
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

/// A bad-input failure ([`exit::USAGE`]) saying `message`.
pub fn usage(message: impl Into<String>) -> Failure {
    Failure {
        code: exit::USAGE,
        message: message.into(),
    }
}

/// Parses a run id from the command line.
///
/// # Errors
/// A usage failure naming the rule the id breaks.
pub fn run_id(id: &str) -> Result<RunId, Failure> {
    Ok(RunId::new(id)?)
}

/// The store settings every command takes, global to all subcommands.
#[derive(clap::Args, Debug)]
pub struct StoreArgs {
    /// A TOML configuration file (keys: store, ttl_ms, heartbeat_ms, namespace, replicas,
    /// replica_timeout_ms, sync_replicas, max_connections).
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Store URL, required (there is no default): postgres://… (or postgres://h1,h2/db),
    /// redis://…, rediss://…, redis+cluster://h1:p1,h2:p2, redis+sentinel://s1:p1,s2:p2/SERVICE,
    /// or memory: (inside this one process: tests and `lease demo` only) [env: LEASE_STORE]
    #[arg(long, global = true, value_name = "URL")]
    pub store: Option<String>,
    /// Namespace: Postgres schema or Redis key prefix [env: LEASE_NAMESPACE]
    #[arg(long, global = true)]
    pub namespace: Option<String>,
    /// Lease TTL in milliseconds [env: LEASE_TTL_MS]
    #[arg(long, global = true, value_name = "MS")]
    pub ttl_ms: Option<u64>,
    /// Heartbeat interval in milliseconds; default TTL/3 [env: LEASE_HEARTBEAT_MS]
    #[arg(long, global = true, value_name = "MS")]
    pub heartbeat_ms: Option<u64>,
    /// Postgres pool size, 1 to 1000; default 10 [env: LEASE_MAX_CONNECTIONS]
    #[arg(long, global = true, value_name = "N")]
    pub max_connections: Option<u32>,
}

impl StoreArgs {
    /// The configuration: defaults, then the file, then the environment, then these flags.
    ///
    /// # Errors
    /// A usage failure for a bad setting, or when no store is named (there is no default);
    /// the store URL is checked, not connected to.
    pub fn config(&self) -> Result<Config, Failure> {
        let config = self.load()?;
        config.backend()?;
        Ok(config)
    }

    /// [`config`](StoreArgs::config) without requiring a store: for `lease demo`, which runs
    /// on the embedded store when none is named.
    ///
    /// # Errors
    /// A usage failure for a bad setting.
    pub fn load(&self) -> Result<Config, Failure> {
        let mut config = Config::load(self.config.as_deref())?;
        if let Some(store) = &self.store {
            config = config.with_store(store.clone());
        }
        if let Some(ns) = &self.namespace {
            config = config.with_namespace(ns.clone());
        }
        if let Some(ms) = self.ttl_ms {
            config = config.with_ttl(Ttl::from_millis(ms)?);
        }
        if let Some(ms) = self.heartbeat_ms {
            if ms == 0 {
                return Err(usage("--heartbeat-ms must be at least 1"));
            }
            config = config.with_heartbeat(Duration::from_millis(ms));
        }
        if let Some(n) = self.max_connections {
            config = config.with_max_connections(n)?;
        }
        Ok(config)
    }
}

/// Prepares the environment of a command `lease run` or `lease worker` starts: the parent's,
/// less the store's settings ([`Config::ENV_VARS`]: `LEASE_STORE` with its password,
/// `LEASE_NAMESPACE`, `LEASE_TTL_MS` and the rest), which are the `lease` process's to use,
/// not the command's. Everything else passes through; the caller adds the lease's own
/// variables (`LEASE_RUN`, `LEASE_FENCE`, …).
pub fn without_store_env(command: &mut tokio::process::Command) -> &mut tokio::process::Command {
    for var in Config::ENV_VARS {
        command.env_remove(var);
    }
    command
}

/// Runs `work` on a two-thread runtime with logging to stderr, and turns its outcome into the
/// process's exit code, printing a failure as `PROGRAM: MESSAGE`.
///
/// The log filter comes from `RUST_LOG` (for example `RUST_LOG=lease_runtime=debug` for a span per
/// store call), or the older `LEASE_LOG`; errors only by default.
pub fn main_with<F>(program: &str, work: F) -> ExitCode
where
    F: std::future::Future<Output = Result<u8, Failure>>,
{
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
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
            eprintln!("{program}: cannot start the async runtime: {e}");
            return ExitCode::from(exit::FAILURE);
        }
    };
    match runtime.block_on(work) {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            eprintln!("{program}: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}
