//! `lease-bench`: the benchmark of BENCHMARKS.md, out of the operator's CLI.
//!
//! It measures the library against the identical raw statement or script, against the best
//! statement for the job, across table sizes, and as the `Worker` runtime, plus batched
//! heartbeats, `claim_next` under contention and takeover. Every effect it counts is validated
//! in the store afterwards.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use distribution::{Config, ConfigError};

mod bench;

/// Exit codes: 0 success, 1 the bench failed (a fixture, a call, or a validation), 2 bad input.
pub(crate) mod exit {
    /// The bench failed: setup, a store call, or a validation.
    pub(crate) const FAILURE: u8 = 1;
    /// Bad input: arguments, URLs, configuration.
    pub(crate) const USAGE: u8 = 2;
}

#[derive(Parser)]
#[command(
    name = "lease-bench",
    version,
    about = "Benchmark the lease library against the identical raw statements, the best \
             statements for the job, table sizes and the Worker runtime (see BENCHMARKS.md)"
)]
struct Cli {
    /// A TOML configuration file, as `lease --config` reads it (the bench uses its store,
    /// namespace and max_connections).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// One store to measure: postgres://… or redis://… [env: LEASE_STORE]. Without it (or with
    /// memory:) the bench starts private PostgreSQL and Redis servers and measures both.
    #[arg(long, value_name = "URL")]
    store: Option<String>,
    /// Prefix of the namespaces (Postgres schemas, Redis key prefixes) the bench creates; each
    /// measurement still gets a fresh one [env: LEASE_NAMESPACE]
    #[arg(long)]
    namespace: Option<String>,
    /// Postgres pool size of both the library and the raw path, 1 to 1000; default 16 (one
    /// connection per client at the most clients measured) [env: LEASE_MAX_CONNECTIONS]
    #[arg(long, value_name = "N")]
    max_connections: Option<u32>,
    #[command(flatten)]
    args: bench::BenchArgs,
}

/// A failure with the exit code it maps to and a one-sentence message.
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
}

impl From<ConfigError> for Failure {
    fn from(e: ConfigError) -> Failure {
        Failure {
            code: match e {
                ConfigError::Store(_) => exit::FAILURE,
                _ => exit::USAGE,
            },
            message: e.to_string(),
        }
    }
}

/// The configuration as `lease` builds it: defaults, then the file, then the environment, then
/// flags.
fn config(cli: &Cli) -> Result<Config, Failure> {
    let mut config = Config::load(cli.config.as_deref())?;
    if let Some(store) = &cli.store {
        config = config.with_store(store.clone());
    }
    if let Some(ns) = &cli.namespace {
        config = config.with_namespace(ns.clone());
    }
    if let Some(n) = cli.max_connections {
        config = config.with_max_connections(n)?;
    }
    // No store: the bench starts its own servers (the library's "no default store" rule is
    // about a command that would run work somewhere nobody chose; this one chooses).
    if !config.store.trim().is_empty() {
        config.backend()?;
    }
    Ok(config)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LEASE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .init();
    let config = match config(&cli) {
        Ok(config) => config,
        Err(failure) => {
            eprintln!("lease-bench: {}", failure.message);
            return ExitCode::from(failure.code);
        }
    };
    // Two worker threads, as the `lease` command runs: the machine the figures come from has
    // two CPUs, shared with the servers.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lease-bench: cannot start the async runtime: {e}");
            return ExitCode::from(exit::FAILURE);
        }
    };
    match runtime.block_on(bench::run(&config, cli.args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("lease-bench: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}
