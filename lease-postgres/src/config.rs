//! How to reach Postgres: URL (one host or several), schema, pool size, timeouts, and the
//! durability the store demands of the server.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;

use lease_core::redact_url;

use crate::error::PgError;

/// The schema a store uses unless told otherwise.
pub const DEFAULT_SCHEMA: &str = "lease";

/// The URL parameters this adapter reads itself (see [`PostgresConfig::from_url`]).
const OWN_PARAMETERS: [&str; 10] = [
    "pooler",
    "listen_url",
    "migrate",
    "wake_ups",
    "sync_replicas",
    "sync_timeout_ms",
    "lock_wait_ms",
    "call_timeout_ms",
    "volatile",
    "async_standbys",
];

/// The longest a timeout of the adapter may be set to: a day. A longer one is a unit mistake,
/// and some would overflow the clock arithmetic or the server's setting.
const MAX_TIMEOUT: Duration = Duration::from_secs(86_400);

/// The URL parameters sqlx 0.8 documents and reads; every other parameter is refused.
const SQLX_PARAMETERS: [&str; 18] = [
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// Connection settings for a [`PostgresLeaseStore`](crate::PostgresLeaseStore).
///
/// `Debug` and `Display` print the URL with its password replaced by `******`.
///
/// ```
/// use std::time::Duration;
/// use lease_postgres::PostgresConfig;
/// let config = PostgresConfig::from_url("postgres://app:s3cret@db1:5432,db2:5432/engine?sync_replicas=1")
///     .with_schema("tenant_a")
///     .with_max_connections(16)
///     .with_acquire_timeout(Duration::from_secs(2));
/// assert!(!format!("{config:?}").contains("s3cret"));
/// ```
#[derive(Clone)]
pub struct PostgresConfig {
    pub(crate) url: String,
    pub(crate) schema: String,
    pub(crate) max_connections: u32,
    pub(crate) acquire_timeout: Duration,
    pub(crate) migrate: Option<bool>,
    pub(crate) wake_ups: Option<bool>,
    pub(crate) sync_replicas: Option<u32>,
    pub(crate) sync_timeout: Option<Duration>,
    pub(crate) lock_wait: Option<Duration>,
    pub(crate) call_timeout: Option<Duration>,
    pub(crate) volatile: Option<bool>,
    pub(crate) async_standbys: Option<bool>,
    pub(crate) transaction_floor: Duration,
    pub(crate) transaction_cap: Duration,
    pub(crate) signal_key: Option<lease_core::SignalKey>,
    pub(crate) pooler: Option<bool>,
    pub(crate) listen_url: Option<String>,
}

/// What the URL says, checked.
pub(crate) struct Parsed {
    /// One set of options per host, in the URL's order, without session settings.
    pub(crate) hosts: Vec<PgConnectOptions>,
    pub(crate) sync_replicas: u32,
    pub(crate) sync_timeout: Duration,
    pub(crate) lock_wait: Duration,
    pub(crate) call_timeout: Duration,
    pub(crate) volatile: bool,
    /// Standbys that acknowledge nothing are accepted (`async_standbys=accept`).
    pub(crate) async_standbys: bool,
    pub(crate) migrate: bool,
    pub(crate) wake_ups: bool,
    /// Behind a pooler in transaction mode (`pooler=transaction`): see `pooler.rs`.
    pub(crate) pooler: bool,
    /// Where to `LISTEN` past the pooler (`listen_url=`), with the main URL's user info,
    /// database and driver parameters.
    pub(crate) listen: Option<PgConnectOptions>,
}

impl PostgresConfig {
    /// Settings for the database at `url`, with schema [`DEFAULT_SCHEMA`], 10 connections, a
    /// 5 s acquire timeout and migrations on. The URL is parsed when connecting.
    ///
    /// The URL is `postgres://user:password@host:port/db?...`; several hosts may be listed,
    /// comma-separated (`postgres://u:p@h1:5432,h2:5432/db`), in which case the store works on
    /// whichever of them is the primary (`pg_is_in_recovery()` is false) and moves to another
    /// when that one fails or turns out to be a standby.
    ///
    /// URL parameters are strict: besides those sqlx reads (`sslmode`, `sslrootcert`,
    /// `sslcert`, `sslkey`, `statement-cache-capacity`, `application_name`, `options`, …)
    /// only these are understood, and any other is a [`Misconfigured`](lease_core::Error::Misconfigured)
    /// error naming it:
    ///
    /// | parameter | meaning | default |
    /// |---|---|---|
    /// | `sync_replicas=N` | as [`with_sync_replicas`](Self::with_sync_replicas) | 0 |
    /// | `sync_timeout_ms=MS` | as [`with_sync_timeout`](Self::with_sync_timeout) | 2000 |
    /// | `lock_wait_ms=MS` | as [`with_lock_wait`](Self::with_lock_wait) | 1000 |
    /// | `call_timeout_ms=MS` | as [`with_call_timeout`](Self::with_call_timeout) | 5000 |
    /// | `volatile=true` | as [`with_volatile`](Self::with_volatile) | false |
    /// | `async_standbys=accept` | as [`with_async_standbys_accepted`](Self::with_async_standbys_accepted) | refused |
    /// | `migrate=false` | as [`with_migrations`](Self::with_migrations) | true |
    /// | `wake_ups=false` | as [`with_wake_ups`](Self::with_wake_ups) | true |
    /// | `pooler=transaction` | as [`with_transaction_pooler`](Self::with_transaction_pooler) | none |
    /// | `listen_url=postgres://HOST:PORT` | as [`with_listen_url`](Self::with_listen_url) | none |
    pub fn from_url(url: impl Into<String>) -> PostgresConfig {
        PostgresConfig {
            url: url.into(),
            schema: DEFAULT_SCHEMA.to_owned(),
            max_connections: 10,
            acquire_timeout: Duration::from_secs(5),
            migrate: None,
            wake_ups: None,
            sync_replicas: None,
            sync_timeout: None,
            lock_wait: None,
            call_timeout: None,
            volatile: None,
            async_standbys: None,
            transaction_floor: Duration::from_millis(250),
            transaction_cap: Duration::from_secs(60),
            signal_key: None,
            pooler: None,
            listen_url: None,
        }
    }

    /// Settings for [`PostgresLeaseStore::from_pool`](crate::PostgresLeaseStore::from_pool),
    /// which takes its connections from the caller's pool: the defaults of
    /// [`from_url`](Self::from_url), changed with the `with_*` setters. (A `from_url` config
    /// works there too: its parameters apply, its hosts are ignored.)
    pub fn for_pool() -> PostgresConfig {
        PostgresConfig::from_url("postgres://pool")
    }

    /// Keeps the store's tables in `schema` (created if missing), so several tenants or test
    /// cases share a database without seeing each other. 1 to 63 bytes; any characters.
    pub fn with_schema(mut self, schema: impl Into<String>) -> PostgresConfig {
        self.schema = schema.into();
        self
    }

    /// Signs and checks [`SignalToken`](lease_core::SignalToken)s with `key` (see
    /// [`SignalKey`](lease_core::SignalKey)).
    pub fn with_signal_key(mut self, key: lease_core::SignalKey) -> PostgresConfig {
        self.signal_key = Some(key);
        self
    }

    /// The most connections the store's pool opens (at least 1).
    pub fn with_max_connections(mut self, max: u32) -> PostgresConfig {
        self.max_connections = max.max(1);
        self
    }

    /// How long an operation waits for a pooled connection (or for a new connection to be
    /// made) before failing with a retryable [`Error::Unavailable`](lease_core::Error::Unavailable).
    pub fn with_acquire_timeout(mut self, timeout: Duration) -> PostgresConfig {
        self.acquire_timeout = timeout;
        self
    }

    /// Whether connecting runs the embedded migrations (default `true`; overrides the URL's
    /// `migrate=`). Turn off when the schema is managed elsewhere (run
    /// [`PostgresLeaseStore::migrate`](crate::PostgresLeaseStore::migrate) or
    /// [`migrator`](crate::migrator) in your own migration step) or when the caller may not run
    /// DDL: connecting then runs none, and refuses with
    /// [`Misconfigured`](lease_core::Error::Misconfigured) a schema that lacks this release's
    /// migrations.
    pub fn with_migrations(mut self, migrate: bool) -> PostgresConfig {
        self.migrate = Some(migrate);
        self
    }

    /// Requires every claim and fenced write to be durable on `n` synchronous standbys before
    /// it is reported (0, the default, requires none). Overrides the URL's `sync_replicas`.
    ///
    /// With `n > 0` the store sets `synchronous_commit = on` on its sessions, checks on every
    /// new connection that the server is a primary whose `synchronous_standby_names` is set and
    /// that at least `n` synchronous standbys stream from it, and after every write confirms in
    /// `pg_stat_replication` that `n` of them flushed it. A write that is not confirmed within
    /// the [sync timeout](Self::with_sync_timeout) is reported as a retryable
    /// [`Unavailable`](lease_core::Error::Unavailable), never as success: a claim is not handed
    /// out. The role needs `pg_monitor` (or superuser) to read the standbys' positions. The
    /// store names its sessions (`application_name = lease-postgres <pid>.<n>`) to find its own
    /// waits, replacing a URL's `application_name`.
    pub fn with_sync_replicas(mut self, n: u32) -> PostgresConfig {
        self.sync_replicas = Some(n);
        self
    }

    /// How long a write waits for its synchronous standbys before its wait is cancelled and it
    /// is reported as [`Unavailable`](lease_core::Error::Unavailable) (default 2 s). Overrides
    /// the URL's `sync_timeout_ms`.
    pub fn with_sync_timeout(mut self, timeout: Duration) -> PostgresConfig {
        self.sync_timeout = Some(timeout);
        self
    }

    /// How long any statement of the store waits for a row lock held by another transaction
    /// (Postgres `lock_timeout`, set on every session), default 1 s. A `claim`, `renew` or
    /// fenced write that waits longer fails with a retryable
    /// [`Unavailable`](lease_core::Error::Unavailable). Overrides the URL's `lock_wait_ms`.
    pub fn with_lock_wait(mut self, wait: Duration) -> PostgresConfig {
        self.lock_wait = Some(wait);
        self
    }

    /// The most time any one call of the store may take, from asking for a connection to the
    /// answer, default 5 s; overrides the URL's `call_timeout_ms`. A call that gets no answer
    /// in time (a server or network that stopped answering without closing the connection)
    /// fails with a retryable [`Unavailable`](lease_core::Error::Unavailable) instead of
    /// waiting for TCP to give up (about 15 minutes), and its connection is closed, never
    /// reused. Such a write may or may not have committed, as any unanswered write. Keep it
    /// well inside your leases' TTL (a renewal must fail in time for a retry), and above the
    /// [sync timeout](Self::with_sync_timeout) under `sync_replicas`, which connecting checks.
    pub fn with_call_timeout(mut self, timeout: Duration) -> PostgresConfig {
        self.call_timeout = Some(timeout);
        self
    }

    /// Accepts (`true`) or refuses (`false`, the default) a server on which an acknowledged
    /// claim can be lost, so that **a fence may be issued twice after a crash**: `fsync = off`,
    /// or a session `synchronous_commit` the store cannot set to `on`. With `true` the store
    /// connects anyway, logs one warning naming what it accepted, and shows it in its
    /// `Display`; overrides the URL's `volatile`. The same word and meaning as the Redis
    /// adapter's `volatile=true`.
    pub fn with_volatile(mut self, volatile: bool) -> PostgresConfig {
        self.volatile = Some(volatile);
        self
    }

    /// Accepts (`true`) or refuses (`false`, the default) standbys that acknowledge nothing:
    /// with [`sync_replicas`](Self::with_sync_replicas) at 0, a store whose URL lists several
    /// hosts (it would follow a promoted standby) or whose primary has standbys streaming from
    /// it (`pg_stat_replication`) is refused, because a standby promoted after a failure lacks
    /// the last claims the primary acknowledged and **issues their fences again**. Accept this
    /// one risk, and no other (`fsync` and `synchronous_commit` are still checked), for read
    /// replicas that are never promoted while the store runs; otherwise set `sync_replicas`.
    /// Overrides the URL's `async_standbys=accept`. What was accepted shows in `Display` and
    /// [`accepted_risks`](crate::PostgresLeaseStore::accepted_risks).
    pub fn with_async_standbys_accepted(mut self, accept: bool) -> PostgresConfig {
        self.async_standbys = Some(accept);
        self
    }

    /// Whether the store's workers are woken by `LISTEN/NOTIFY` (`true`, the default) or only
    /// poll (`false`; overrides the URL's `wake_ups=`). With wake-ups, every write that makes a
    /// run claimable notifies the schema's channel when it commits, and the first
    /// [`Worker`](lease_runtime::Worker) of a store starts one listening session for all of the
    /// store's workers, taken from the store's pool. Turn them off behind a connection pooler
    /// in transaction mode (PgBouncer's `pool_mode = transaction`), where a `LISTEN` does not
    /// stay on one session: the workers then poll, as
    /// [`WorkerConfig::with_poll_interval`](lease_runtime::WorkerConfig::with_poll_interval)
    /// says.
    ///
    /// The store's own writes are notified by the store once they commit, many at a time (its
    /// sessions start with `lease.wake_ups = off`, which the trigger reads, so that no writer
    /// holds the server's notification queue lock through its commit's flush; 16 writers on a
    /// durable server: 0.82× the creates of a store without wake-ups, against 0.25× when each
    /// write notified; `tests/wake_cost.rs`). Writes in your transactions are notified by the
    /// trigger at your commit.
    ///
    /// Off, the store neither listens nor notifies. Turn them off on **every** store of the
    /// schema, not only the listeners': a worker that listens is not woken by a store that
    /// does not notify, and finds those runs at its fallback poll. The store's caller pool
    /// ([`PostgresLeaseStore::pool`](crate::PostgresLeaseStore::pool)) then starts its sessions
    /// silent as well; writes in a transaction on a pool of your own (`create_in` on it) still
    /// notify.
    pub fn with_wake_ups(mut self, on: bool) -> PostgresConfig {
        self.wake_ups = Some(on);
        self
    }

    /// Works through a connection pooler in transaction mode (`true`; overrides the URL's
    /// `pooler=transaction`), such as PgBouncer with `pool_mode = transaction`, where
    /// consecutive transactions of one client connection may run on different server sessions
    /// and a session setting one client makes outlives its transaction:
    ///
    /// - no startup `options` parameter (PgBouncer refuses it): every statement of the store
    ///   runs in a transaction of its own that begins `READ COMMITTED` with its settings
    ///   transaction-local (`SET LOCAL lock_timeout`, `synchronous_commit = on`, `jit = off`,
    ///   `lease.wake_ups = off`), so no setting is lost and none leaks to another client;
    /// - no named prepared statements: each statement is parsed anew (PgBouncer 1.18 keeps no
    ///   prepared statements across transactions);
    /// - migrations run in one transaction under a transaction-level advisory lock;
    /// - `LISTEN` needs one session: the store's workers listen on the
    ///   [listen URL](Self::with_listen_url) when one is given, and otherwise poll (one log
    ///   line says which). The store's writes still notify, for listeners elsewhere.
    ///
    /// The durability checks hold: `fsync` is read through the pooler, and every write
    /// commits synchronously. Not with [`sync_replicas`](Self::with_sync_replicas): the
    /// standbys' confirmation must be read on the session that committed, which a pooler does
    /// not keep (connecting refuses the pair; give the store the primary's own address).
    ///
    /// What it costs: three round trips more per call (the `BEGIN`, the parse, the `COMMIT`);
    /// BENCHMARKS.md has the figures.
    pub fn with_transaction_pooler(mut self, on: bool) -> PostgresConfig {
        self.pooler = Some(on);
        self
    }

    /// A direct address of the server (`postgres://HOST:PORT[/DATABASE]`, not through the
    /// pooler) where the store's workers `LISTEN` for wake-ups when the store works through a
    /// [transaction pooler](Self::with_transaction_pooler); overrides the URL's `listen_url=`.
    /// The user, password, database (unless given) and driver parameters are the main URL's;
    /// a user or password here is refused, so that the password is written once.
    pub fn with_listen_url(mut self, url: impl Into<String>) -> PostgresConfig {
        self.listen_url = Some(url.into());
        self
    }

    /// The floor and cap of a fenced transaction's bound (defaults 250 ms and 60 s); see
    /// [`PostgresLeaseStore::fenced_transaction`](crate::PostgresLeaseStore::fenced_transaction).
    pub fn with_transaction_bound(mut self, floor: Duration, cap: Duration) -> PostgresConfig {
        self.transaction_floor = floor.max(Duration::from_millis(1));
        self.transaction_cap = cap.max(self.transaction_floor);
        self
    }

    /// The schema the store uses.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The URL as [`lease_core::redact_url`] shows it: password, secret-looking parameter
    /// values and fragment replaced by `******`.
    pub fn redacted_url(&self) -> String {
        redact_url(&self.url)
    }

    /// Parses and checks the URL.
    pub(crate) fn parse(&self) -> Result<Parsed, PgError> {
        let shown = self.redacted_url();
        let rest = self
            .url
            .strip_prefix("postgres://")
            .or_else(|| self.url.strip_prefix("postgresql://"))
            .ok_or_else(|| {
                PgError::Config(format!("{shown} is not a postgres:// or postgresql:// URL"))
            })?;
        // Refused rather than guessed: each of these makes the URL mean something else to sqlx
        // than it may to its author, and the redactor would have to mask far more of it.
        if rest.contains('#') {
            return Err(PgError::Config(format!(
                "{shown}: a '#' is not allowed in a postgres URL; percent-encode it as %23 in a \
                 password or a parameter value"
            )));
        }
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        if query.contains('@') {
            return Err(PgError::Config(format!(
                "{shown}: a raw '@' after the '?' is ambiguous; percent-encode it as %40 in a \
                 parameter value (and a '?' in a password as %3F)"
            )));
        }
        let (authority, path) = match rest.find('/') {
            Some(slash) => rest.split_at(slash),
            None => (rest, ""),
        };
        if path.contains('@') {
            return Err(PgError::Config(format!(
                "{shown}: a '/' before the '@' of the user info; percent-encode it as %2F in a \
                 user name or password (or an '@' in the database name as %40)"
            )));
        }
        let (userinfo, host_list) = match authority.rfind('@') {
            Some(at) => (&authority[..=at], &authority[at + 1..]),
            None => ("", authority),
        };
        let mut sync_replicas = 0;
        let mut sync_timeout = Duration::from_secs(2);
        let mut lock_wait = Duration::from_secs(1);
        let mut call_timeout = Duration::from_secs(5);
        let mut volatile = false;
        let mut async_standbys = false;
        let mut migrate = true;
        let mut wake_ups = true;
        let mut pooler = false;
        let mut listen_url = None;
        let mut passed = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let number = || {
                value.parse::<u64>().map_err(|_| {
                    PgError::Config(format!(
                        "URL parameter {key}={value:?} must be a whole number"
                    ))
                })
            };
            match key {
                "sync_replicas" => {
                    sync_replicas = u32::try_from(number()?).map_err(|_| {
                        PgError::Config(format!("sync_replicas={value} is out of range"))
                    })?;
                }
                "sync_timeout_ms" => sync_timeout = Duration::from_millis(number()?),
                "lock_wait_ms" => lock_wait = Duration::from_millis(number()?),
                "call_timeout_ms" => call_timeout = Duration::from_millis(number()?),
                "pooler" => {
                    pooler = match value {
                        "transaction" => true,
                        "none" => false,
                        _ => {
                            return Err(PgError::Config(format!(
                                "pooler={value:?}: expected transaction (a pooler such as \
                                 PgBouncer with pool_mode = transaction between the store and \
                                 the server) or none"
                            )))
                        }
                    };
                }
                "listen_url" => listen_url = Some(value.to_owned()),
                "async_standbys" => {
                    async_standbys = match value {
                        "accept" => true,
                        "refuse" => false,
                        _ => {
                            return Err(PgError::Config(format!(
                                "async_standbys={value:?}: expected accept (standbys that \
                                 acknowledge nothing may exist and are never promoted) or refuse"
                            )))
                        }
                    };
                }
                "volatile" | "migrate" | "wake_ups" => {
                    let flag = match value {
                        "true" | "1" | "yes" => true,
                        "false" | "0" | "no" => false,
                        _ => {
                            return Err(PgError::Config(format!(
                                "{key}={value:?}: expected true or false"
                            )))
                        }
                    };
                    match key {
                        "volatile" => volatile = flag,
                        "migrate" => migrate = flag,
                        _ => wake_ups = flag,
                    }
                }
                "sslmode"
                    if matches!(value, "require" | "verify-ca" | "verify-full")
                        && !cfg!(any(feature = "tls-rustls", feature = "tls-native-tls")) =>
                {
                    return Err(PgError::Config(format!(
                        "{shown}: sslmode={value} needs TLS, which this build of lease-postgres \
                         leaves out: enable its `tls-rustls` or `tls-native-tls` feature \
                         (through the distribution crate, the feature of the same name)"
                    )));
                }
                k if SQLX_PARAMETERS.contains(&k) || k.starts_with("options[") => {
                    passed.push(pair);
                }
                other => {
                    let hint = if other.to_ascii_lowercase().contains("pass") {
                        " (a password goes in the user info, postgres://user:PASSWORD@host/db, \
                         or in password=, lower-case)"
                    } else {
                        ""
                    };
                    return Err(PgError::Config(format!(
                        "unknown URL parameter {other:?} in {shown}{hint}: lease-postgres \
                         understands {} and sqlx's {}",
                        OWN_PARAMETERS.join(", "),
                        SQLX_PARAMETERS.join(", ")
                    )));
                }
            }
        }
        let query = if passed.is_empty() {
            String::new()
        } else {
            format!("?{}", passed.join("&"))
        };
        let mut hosts = Vec::new();
        for host in host_list.split(',') {
            if host_list.contains(',') && host.is_empty() {
                return Err(PgError::Config(format!(
                    "an empty host in the list of {shown}"
                )));
            }
            let one = format!("postgres://{userinfo}{host}{path}{query}");
            let options = PgConnectOptions::from_str(&one)
                .map_err(|e| PgError::Config(format!("{shown}: {e}")))?;
            hosts.push(options);
        }
        let parsed = Parsed {
            hosts,
            sync_replicas: self.sync_replicas.unwrap_or(sync_replicas),
            sync_timeout: self.sync_timeout.unwrap_or(sync_timeout),
            lock_wait: self.lock_wait.unwrap_or(lock_wait),
            call_timeout: self.call_timeout.unwrap_or(call_timeout),
            volatile: self.volatile.unwrap_or(volatile),
            async_standbys: self.async_standbys.unwrap_or(async_standbys),
            migrate: self.migrate.unwrap_or(migrate),
            wake_ups: self.wake_ups.unwrap_or(wake_ups),
            pooler: self.pooler.unwrap_or(pooler),
            listen: None,
        };
        let listen_url = self.listen_url.clone().or(listen_url);
        let parsed = crate::pooler::checked(parsed, listen_url, (userinfo, path, &query))?;
        for (name, value) in [
            ("sync_timeout_ms", parsed.sync_timeout),
            ("lock_wait_ms", parsed.lock_wait),
            ("call_timeout_ms", parsed.call_timeout),
            ("acquire timeout", self.acquire_timeout),
        ] {
            // Under 1 ms a timeout would be sent as 0, which Postgres reads as "no limit".
            if value < Duration::from_millis(1) || value > MAX_TIMEOUT {
                return Err(PgError::Config(format!(
                    "{name} of {value:?} is out of range: it must be 1 ms to 1 day (a lock wait \
                     under 1 ms would be sent as 0, which Postgres reads as no limit at all)"
                )));
            }
        }
        if parsed.hosts.len() > 1
            && parsed.sync_replicas == 0
            && !parsed.async_standbys
            && !parsed.volatile
        {
            return Err(PgError::Config(format!(
                "{shown} lists {} hosts, so the store follows a standby when it is promoted, and \
                 with sync_replicas=0 a claim is acknowledged before any standby has it: the \
                 promoted standby would issue its fence again; set sync_replicas=N (with \
                 synchronous_standby_names on the primary), or accept exactly this risk with \
                 async_standbys=accept",
                parsed.hosts.len()
            )));
        }
        if parsed.sync_replicas > 0 && parsed.call_timeout <= parsed.sync_timeout {
            return Err(PgError::Config(format!(
                "call_timeout_ms={} is not above sync_timeout_ms={}: a write waiting for its \
                 standbys would be abandoned before its wait is bounded; raise the call timeout",
                parsed.call_timeout.as_millis(),
                parsed.sync_timeout.as_millis()
            )));
        }
        Ok(parsed)
    }
}

impl fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("url", &self.redacted_url())
            .field("schema", &self.schema)
            .field("max_connections", &self.max_connections)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("migrate", &self.migrate)
            .field("wake_ups", &self.wake_ups)
            .field("sync_replicas", &self.sync_replicas)
            .field("sync_timeout", &self.sync_timeout)
            .field("lock_wait", &self.lock_wait)
            .field("call_timeout", &self.call_timeout)
            .field("volatile", &self.volatile)
            .field("async_standbys", &self.async_standbys)
            .field("transaction_floor", &self.transaction_floor)
            .field("transaction_cap", &self.transaction_cap)
            .field("signal_key", &self.signal_key)
            .finish()
    }
}

impl fmt::Display for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (schema {})", self.redacted_url(), self.schema)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_display_hide_the_password() {
        let config = PostgresConfig::from_url("postgres://app:hunter2@localhost:5432/db");
        for shown in [format!("{config:?}"), config.to_string()] {
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(shown.contains("app:******@localhost"), "{shown}");
        }
    }

    #[test]
    fn the_leaking_urls_of_issue_14_are_redacted() {
        for (url, expected) in [
            (
                "postgres://app@db/x?password=hunter2",
                "postgres://app@db/x?password=******",
            ),
            ("postgres://app:hun/ter2@db/x", "postgres://app:******@db/x"),
            (
                "postgres://app@db/x?PASSWORD=hunter2",
                "postgres://app@db/x?PASSWORD=******",
            ),
            (
                "postgres://app@db/x?api_token=hunter2",
                "postgres://app@db/x?api_token=******",
            ),
        ] {
            let config = PostgresConfig::from_url(url);
            assert_eq!(config.redacted_url(), expected);
            for shown in [format!("{config:?}"), config.to_string()] {
                assert!(!shown.contains("hun"), "{shown}");
            }
        }
    }

    #[test]
    fn a_host_list_hides_the_password_too() {
        let config = PostgresConfig::from_url("postgres://app:hunter2@h1:5432,h2:5433/db");
        for shown in [format!("{config:?}"), config.to_string()] {
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(shown.contains("app:******@h1:5432,h2:5433/db"), "{shown}");
        }
        let err = PostgresConfig::from_url("postgres://app:hunter2@h1:5432,h2:notaport/db")
            .parse()
            .err()
            .unwrap();
        assert!(!format!("{err} {err:?}").contains("hunter2"), "{err:?}");
    }

    #[test]
    fn several_hosts_and_own_parameters_are_read() {
        let config = PostgresConfig::from_url(
            "postgres://app:pw@h1:5432,h2:6543/db?sync_replicas=2&sync_timeout_ms=700&lock_wait_ms=300&sslmode=disable&application_name=x",
        );
        let parsed = config.parse().unwrap();
        let hosts: Vec<(String, u16)> = parsed
            .hosts
            .iter()
            .map(|o| (o.get_host().to_owned(), o.get_port()))
            .collect();
        assert_eq!(hosts, [("h1".to_owned(), 5432), ("h2".to_owned(), 6543)]);
        assert_eq!(parsed.hosts[1].get_database(), Some("db"));
        assert_eq!(parsed.sync_replicas, 2);
        assert_eq!(parsed.sync_timeout, Duration::from_millis(700));
        assert_eq!(parsed.lock_wait, Duration::from_millis(300));
        let overridden = config.with_sync_replicas(1).parse().unwrap();
        assert_eq!(overridden.sync_replicas, 1);
    }

    /// A lock wait under 1 ms used to be sent as `lock_timeout = 0`, which Postgres reads as
    /// no limit at all; every timeout is refused out of 1 ms to 1 day, by name.
    #[test]
    fn timeouts_that_would_mean_no_limit_are_refused_by_name() {
        let url = "postgres://app:pw1234@h/db";
        let sub_ms = Duration::from_micros(500);
        for (config, named) in [
            (
                PostgresConfig::from_url(url).with_lock_wait(sub_ms),
                "lock_wait_ms",
            ),
            (
                PostgresConfig::from_url(url).with_sync_timeout(sub_ms),
                "sync_timeout_ms",
            ),
            (
                PostgresConfig::from_url(url).with_call_timeout(Duration::MAX),
                "call_timeout_ms",
            ),
            (
                PostgresConfig::from_url(url).with_acquire_timeout(Duration::ZERO),
                "acquire",
            ),
            (
                PostgresConfig::from_url(format!("{url}?lock_wait_ms=0")),
                "lock_wait_ms",
            ),
        ] {
            let err = lease_core::Error::from(config.parse().err().unwrap());
            assert!(
                matches!(err, lease_core::Error::Misconfigured { .. }),
                "{err:?}"
            );
            let shown = err.to_string();
            assert!(
                shown.contains(named) && shown.contains("1 ms to 1 day"),
                "{shown}"
            );
            assert!(!shown.contains("pw1234"), "{shown}");
        }
    }

    /// Several hosts mean the store follows a promoted standby: without `sync_replicas` that
    /// standby may lack acknowledged claims, so the URL is refused naming both ways out;
    /// `async_standbys=accept` (or `volatile`) accepts exactly that.
    #[test]
    fn several_hosts_without_sync_replicas_are_refused_unless_accepted() {
        let url = "postgres://app:pw1234@h1:5432,h2:5432/db";
        let err = lease_core::Error::from(PostgresConfig::from_url(url).parse().err().unwrap());
        let shown = err.to_string();
        assert!(
            matches!(err, lease_core::Error::Misconfigured { .. }),
            "{err:?}"
        );
        assert!(
            shown.contains("sync_replicas=N") && shown.contains("async_standbys=accept"),
            "{shown}"
        );
        assert!(!shown.contains("pw1234"), "{shown}");
        for ok in [
            format!("{url}?async_standbys=accept"),
            format!("{url}?sync_replicas=1"),
            format!("{url}?volatile=true"),
        ] {
            assert!(PostgresConfig::from_url(&ok).parse().is_ok(), "{ok}");
        }
        assert!(PostgresConfig::from_url(url)
            .with_async_standbys_accepted(true)
            .parse()
            .is_ok());
        let err = PostgresConfig::from_url(format!("{url}?async_standbys=yes"))
            .parse()
            .err()
            .unwrap();
        assert!(err.to_string().contains("async_standbys=\"yes\""), "{err}");
    }

    #[test]
    fn unknown_parameters_are_refused_by_name_without_the_password() {
        for (url, named) in [
            (
                "postgres://app:pw1234@h/db?sync_replica=1",
                "\"sync_replica\"",
            ),
            (
                "postgres://app:pw1234@h/db?synchronous_replicas=1",
                "\"synchronous_replicas\"",
            ),
            (
                "postgres://app:pw1234@h/db?sslmode=disable&lock_wait=5",
                "\"lock_wait\"",
            ),
            ("postgres://app@h/db?pass=pw1234", "\"pass\""),
            ("postgres://app@h/db?PASSWORD=pw1234", "\"PASSWORD\""),
            ("postgres://app@h/db?api_token=pw1234", "\"api_token\""),
            ("postgres://app@h/db?secret_key=pw1234", "\"secret_key\""),
            ("postgres://app@h/db?pass%77ord=pw1234", "\"pass%77ord\""),
            (
                "postgres://app:pw1234@h1:1,h2:2/db?volatle=true",
                "\"volatle\"",
            ),
            ("postgres://app:pw1234#x@h/db", "'#'"),
            ("postgres://app@h/db?password=pw1234#x", "'#'"),
            ("postgres://app:pw1234/x@h/db", "'/'"),
            ("postgres://app:pw1234?x@h/db", "'@'"),
            ("postgres://app@h/db?password=pw1234@x", "'@'"),
        ] {
            let err = PostgresConfig::from_url(url).parse().err().unwrap();
            let err = lease_core::Error::from(err);
            assert!(
                matches!(
                    err,
                    lease_core::Error::Misconfigured {
                        backend: "postgres",
                        ..
                    }
                ),
                "{err:?}"
            );
            let shown = format!("{err} {err:?}");
            assert!(shown.contains(named), "{shown}");
            assert!(!shown.contains("pw1234"), "{shown}");
        }
        let err = PostgresConfig::from_url("postgres://h/db?sync_replicas=two")
            .parse()
            .err()
            .unwrap();
        assert!(err.to_string().contains("sync_replicas"), "{err}");
    }
}
