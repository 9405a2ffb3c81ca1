//! What a benchmark run is given: its arguments, the stores it measures, and its errors.

use super::*;

/// Arguments of `lease-bench` (besides the store, namespace and pool flags).
#[derive(clap::Args)]
pub(crate) struct BenchArgs {
    /// Print the results as JSON instead of tables.
    #[arg(long)]
    pub(crate) json: bool,
    /// Also write the JSON results to this file.
    #[arg(long, value_name = "FILE")]
    pub(crate) json_out: Option<std::path::PathBuf>,
    /// A short run (fewer rounds and runs; about a minute per backend).
    #[arg(long)]
    pub(crate) quick: bool,
    /// Client counts to measure each operation at.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    pub(crate) clients: Vec<usize>,
    /// Operations per round per path, split between the clients (renew_many: calls / 25).
    #[arg(long, value_name = "N")]
    pub(crate) ops: Option<usize>,
    /// Measured A/B round pairs per operation and client count (plus one warm-up pair).
    #[arg(long, value_name = "N")]
    pub(crate) pairs: Option<usize>,
    /// Which parts to run (best, sweep and worker are not in the default run).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "ops,heartbeat,contention,takeover"
    )]
    pub(crate) parts: Vec<Part>,
    /// Table sizes of the sweep, in runs; default 10000,1000000 (--quick: 10000,100000).
    #[arg(long, value_delimiter = ',', value_name = "N,N")]
    pub(crate) sweep_sizes: Option<Vec<usize>>,
    /// Held leases in the sweep's held-leases case; default 100000 (--quick: 20000).
    #[arg(long, value_name = "N")]
    pub(crate) sweep_held: Option<usize>,
    /// Backlog each worker row drains; default 20000 (--quick: 5000).
    #[arg(long, value_name = "N")]
    pub(crate) worker_jobs: Option<usize>,
    /// Worker instance counts of the worker rows.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    pub(crate) worker_counts: Vec<usize>,
    /// Payload bytes each run of the worker rows is created with, which each handler reads
    /// and checks (0: none).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub(crate) worker_payload: usize,
    /// Kinds the runs of the worker rows are spread over, each served by its own handler of
    /// one Worker (`run_kinds`), paired with the same drain of one kind (1: none). With a
    /// payload too, a third drain has both.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub(crate) worker_kinds: usize,
    /// Jobs each drain of the cost part creates and drains.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub(crate) cost_jobs: usize,
    /// Runs held by the worker that shuts down in the handover test.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub(crate) handover_runs: usize,
    /// Runs drained by 16 workers in the claim_next contention test, per path.
    #[arg(long, value_name = "N")]
    pub(crate) contention_runs: Option<usize>,
    /// Runs each claim_next call of the contention test asks for.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub(crate) contention_batch: usize,
    /// Leases held by one worker in the heartbeat test.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub(crate) heartbeat_leases: usize,
    /// Heartbeat ticks (10 s each) observed per mode.
    #[arg(long, value_name = "N")]
    pub(crate) heartbeat_ticks: Option<u32>,
    /// SIGKILL takeover trials per backend.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub(crate) takeover_trials: usize,
    /// Lease TTL of the takeover trials, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1_000)]
    pub(crate) takeover_ttl_ms: u64,
}

/// A part of the benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Part {
    /// Library against raw, per operation and client count.
    Ops,
    /// Batched heartbeats of many leases against one renewal per scope, with memory per lease.
    Heartbeat,
    /// 16 workers draining runs with claim_next.
    Contention,
    /// SIGKILL a worker holding a run; time until another worker claims it.
    Takeover,
    /// The library against the best raw statement for the job (Postgres), and the library's
    /// claim → renew → release cycle against rslock's (Redis), with server CPU per cycle.
    Best,
    /// claim, renew, renew_many(1000) and claim_next(10) at growing table sizes.
    Sweep,
    /// The `Worker` runtime draining a backlog (durable servers), and graceful handover.
    Worker,
    /// Create → handler latency and idle load of 1 and 16 idle workers, wake-ups against
    /// polling.
    Pickup,
    /// What one drained job costs the store: statements or commands and their server time,
    /// transactions, WAL or AOF bytes, rows and index entries written (durable servers).
    Cost,
    /// The Worker's drain against raw loops of the least a durable queue on the same tables
    /// does: claim 64 with one UPDATE … SKIP LOCKED, end them with one fenced UPDATE
    /// (Postgres, durable server), at each worker count.
    Floor,
    /// Exactly-once effects (Postgres, durable server): the journaled effect, the effect in
    /// the handler's own transaction, and the group-committed `PgEffect`, at each worker count.
    Effects,
}

/// Why the benchmark stopped.
#[derive(Debug)]
pub(crate) enum BenchError {
    /// A fixture or setup step failed.
    Setup(String),
    /// An operation did not do what it should (refused, missing, or validation failed).
    Wrong(String),
    /// The library returned an error.
    Store(Error),
    /// sqlx on the raw path.
    Sql(sqlx::Error),
    /// redis-rs on the raw path.
    Redis(redis::RedisError),
}

impl BenchError {
    pub(crate) fn setup(why: impl Into<String>) -> BenchError {
        BenchError::Setup(why.into())
    }

    pub(crate) fn wrong(why: impl Into<String>) -> BenchError {
        BenchError::Wrong(why.into())
    }
}

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BenchError::Setup(why) => write!(f, "bench setup failed: {why}"),
            BenchError::Wrong(why) => write!(f, "bench validation failed: {why}"),
            BenchError::Store(e) => write!(f, "library call failed: {e}"),
            BenchError::Sql(e) => write!(f, "raw sqlx call failed: {e}"),
            BenchError::Redis(e) => write!(f, "raw redis call failed: {e}"),
        }
    }
}

impl From<Error> for BenchError {
    fn from(e: Error) -> Self {
        BenchError::Store(e)
    }
}

impl From<distribution::InvalidInput> for BenchError {
    fn from(e: distribution::InvalidInput) -> Self {
        BenchError::Store(e.into())
    }
}

impl From<sqlx::Error> for BenchError {
    fn from(e: sqlx::Error) -> Self {
        BenchError::Sql(e)
    }
}

impl From<redis::RedisError> for BenchError {
    fn from(e: redis::RedisError) -> Self {
        BenchError::Redis(e)
    }
}

impl From<BenchError> for Failure {
    fn from(e: BenchError) -> Failure {
        Failure {
            code: crate::exit::FAILURE,
            message: e.to_string(),
        }
    }
}

/// Which server a target is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Postgres,
    Redis,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Postgres => "postgres",
            Kind::Redis => "redis",
        }
    }
}

/// A server to benchmark.
pub(crate) struct Target {
    pub(crate) kind: Kind,
    pub(crate) url: String,
    pub(crate) raw: RawConn,
    /// Postgres pool size of both paths (`--max-connections`).
    pub(crate) pool: u32,
    /// Prefix of every namespace the bench creates (`--namespace`), with its separator.
    pub(crate) prefix: String,
}

/// Pool size of both paths unless `--max-connections` says otherwise: one connection per client
/// at the most clients measured.
pub(super) const DEFAULT_POOL: u32 = 16;

impl Target {
    /// A fresh namespace for one measurement, named after `label`.
    pub(crate) fn namespace(&self, label: &str) -> String {
        lease_conformance::fixtures::unique_namespace(&format!("{}{label}", self.prefix))
    }

    /// A library store over namespace `ns`.
    pub(crate) async fn lib(&self, ns: &str) -> Result<Arc<dyn LeaseStore>, BenchError> {
        Ok(match self.kind {
            Kind::Postgres => Arc::new(
                distribution::postgres::PostgresLeaseStore::connect(
                    distribution::postgres::PostgresConfig::from_url(&self.url)
                        .with_schema(ns)
                        .with_max_connections(self.pool)
                        .with_acquire_timeout(Duration::from_secs(60)),
                )
                .await?,
            ),
            Kind::Redis => Arc::new(
                distribution::redis::RedisLeaseStore::connect(
                    distribution::redis::RedisConfig::from_url(&self.url)
                        .with_namespace(ns)
                        .with_response_timeout(Duration::from_secs(30)),
                )
                .await?,
            ),
        })
    }
}
