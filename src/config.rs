//! Backend selection from configuration: one `Config`, read from a TOML file, the environment
//! and flags, and `connect` for `memory:`, `postgres://` and `redis://` / `rediss://` URLs.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use lease_core::{redact_url, InvalidInput, LeaseStore, Ttl};
use lease_runtime::MemoryLeaseStore;

/// Where leases live and how long they last: what a worker or the `lease` command needs to start.
///
/// There is **no default store**: a configuration that names none is refused with
/// [`ConfigError::NoStore`], naming `LEASE_STORE` and `--store`, so a service never runs on a
/// private in-process store without a word. `memory:` works only written out: it is one
/// process's store (tests, demos), and connecting to it logs a warning saying so.
///
/// Sources, lowest precedence first: [`Config::default`], a TOML file ([`Config::from_toml`]),
/// the environment ([`Config::with_env`]: `LEASE_STORE`, `LEASE_TTL_MS`,
/// `LEASE_HEARTBEAT_MS`, `LEASE_NAMESPACE`, `LEASE_REPLICAS`, `LEASE_REPLICA_TIMEOUT_MS`,
/// `LEASE_SYNC_REPLICAS`, `LEASE_MAX_CONNECTIONS`, `LEASE_MIGRATE`, `LEASE_SIGNAL_SECRET`), then
/// flags (the `with_*` setters).
///
/// ```
/// use distribution::Config;
/// let config = Config::from_toml("store = \"memory:\"\nttl_ms = 5000\n").unwrap();
/// assert_eq!(config.ttl.as_millis(), 5000);
/// let config = Config::from_toml("store = \"postgres://app:hunter2@db/runs\"").unwrap();
/// assert!(!format!("{config:?}").contains("hunter2"));
/// ```
///
/// It also deserializes with serde from the same keys as the TOML file, so it nests in an
/// application's own configuration:
///
/// ```
/// #[derive(serde::Deserialize)]
/// struct AppConfig {
///     listen: String,
///     lease: distribution::Config,
/// }
/// let app: AppConfig = toml::from_str(
///     "listen = \"0.0.0.0:8080\"\n[lease]\nstore = \"memory:\"\nttl_ms = 10000\nmigrate = false\n",
/// )
/// .unwrap();
/// assert_eq!((app.listen.as_str(), app.lease.ttl.as_millis()), ("0.0.0.0:8080", 10_000));
/// assert_eq!(app.lease.migrate, Some(false));
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// The store URL: `postgres://…`, `postgresql://…`, `redis://…`, `rediss://…`,
    /// `redis+cluster://…`, `redis+sentinel://…`, `etcd://…`, or `memory:` for one process.
    /// Empty (the default) until a file, the environment or a flag names one.
    pub store: String,
    /// The TTL of the leases a worker takes.
    pub ttl: Ttl,
    /// The heartbeat interval; `None` for TTL/3.
    pub heartbeat: Option<Duration>,
    /// The namespace (Postgres schema, Redis key prefix); `None` for the backend's default.
    pub namespace: Option<String>,
    /// Redis: how many replicas must acknowledge a lease or write before it is reported
    /// (`WAIT`); `None` for the URL's `replicas=` parameter, or 0.
    pub replicas: Option<u32>,
    /// Redis: how long to wait for those acknowledgements; `None` for the URL's
    /// `replica_timeout_ms=` parameter, or 1 s.
    pub replica_timeout: Option<Duration>,
    /// Postgres: how many synchronous standbys must have a commit before a lease or write is
    /// reported; `None` for the URL's `sync_replicas=` parameter, or 0.
    pub sync_replicas: Option<u32>,
    /// Postgres: the most connections the store's pool opens (1 to 1,000); `None` for 10.
    /// Redis multiplexes one connection per store and ignores it.
    pub max_connections: Option<u32>,
    /// Postgres: whether connecting runs the embedded migrations; `None` for the URL's
    /// `migrate=` parameter, or `true`. With `false` no DDL runs and a schema without this
    /// release's migrations is refused (see `lease_postgres::PostgresConfig::with_migrations`).
    pub migrate: Option<bool>,
    /// The key signal tokens are signed and checked with (see
    /// [`SignalKey`](lease_core::SignalKey)): from `LEASE_SIGNAL_SECRET` or the file's
    /// `signal_secret` (16 to 1024 bytes), `None` for unsigned tokens. Every process that
    /// makes or presents the namespace's tokens needs the same. Never shown by `Debug`.
    pub signal_key: Option<lease_core::SignalKey>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            store: String::new(),
            ttl: Ttl::from_secs(30).expect("30 s is a valid TTL"),
            heartbeat: None,
            namespace: None,
            replicas: None,
            replica_timeout: None,
            sync_replicas: None,
            max_connections: None,
            migrate: None,
            signal_key: None,
        }
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("store", &redact_url(&self.store))
            .field("ttl", &self.ttl)
            .field("heartbeat", &self.heartbeat)
            .field("namespace", &self.namespace)
            .field("replicas", &self.replicas)
            .field("replica_timeout", &self.replica_timeout)
            .field("sync_replicas", &self.sync_replicas)
            .field("max_connections", &self.max_connections)
            .field("migrate", &self.migrate)
            .field("signal_key", &self.signal_key)
            .finish()
    }
}

/// The store URL (redacted, as [`redact_url`] shows it), TTL and namespace.
impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (TTL {}", redact_url(&self.store), self.ttl)?;
        if let Some(ns) = &self.namespace {
            write!(f, ", namespace {ns}")?;
        }
        f.write_str(")")
    }
}

/// Why a configuration was refused. Messages never contain a password.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A URL whose scheme no backend serves.
    #[error(
        "unknown store scheme {scheme:?}: use memory:, postgres://, redis://, rediss://, \
         redis+cluster://, redis+sentinel:// or etcd://"
    )]
    UnknownScheme {
        /// The scheme found.
        scheme: String,
    },
    /// A URL that does not parse.
    #[error("malformed store URL {url}: {reason}")]
    MalformedUrl {
        /// The URL with any password replaced by `******`.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A setting with a bad value.
    #[error("bad setting {key}: {reason}")]
    BadSetting {
        /// Where it came from: a TOML key or an environment variable.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A configuration file that cannot be read or parsed.
    #[error("cannot read configuration file {path}: {reason}")]
    File {
        /// The file.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// A URL for a backend this build leaves out: the facade's Cargo feature for it is off.
    #[error(
        "the store URL selects the {backend} backend, which this build leaves out: enable the \
         `{feature}` feature of the distribution crate"
    )]
    FeatureDisabled {
        /// The backend the URL selects: `postgres` or `redis`.
        backend: &'static str,
        /// The Cargo feature that brings it in.
        feature: &'static str,
    },
    /// No store was named: nothing in the file, the environment or the flags. There is no
    /// default, so that a service is never silently given a store of its own process.
    #[error(
        "no store configured: set LEASE_STORE or pass --store with a postgres://, redis:// or \
         etcd:// URL (memory: is a store inside one process, for tests and demos only)"
    )]
    NoStore,
    /// The store refused the connection or could not be reached.
    #[error(transparent)]
    Store(#[from] lease_core::Error),
}

impl ConfigError {
    /// Whether retrying later may help: the store was unreachable.
    pub fn is_retryable(&self) -> bool {
        matches!(self, ConfigError::Store(e) if e.is_retryable())
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    store: Option<String>,
    ttl_ms: Option<u64>,
    heartbeat_ms: Option<u64>,
    namespace: Option<String>,
    replicas: Option<u32>,
    replica_timeout_ms: Option<u64>,
    sync_replicas: Option<u32>,
    max_connections: Option<u64>,
    migrate: Option<bool>,
    signal_secret: Option<String>,
}

impl<'de> serde::Deserialize<'de> for Config {
    /// The keys of [`Config::from_toml`], each checked as there; unknown keys are refused.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Config, D::Error> {
        let file = FileConfig::deserialize(deserializer)?;
        Config::default()
            .apply(file)
            .map_err(serde::de::Error::custom)
    }
}

/// A signal secret setting read from `key`: a [`SignalKey`](lease_core::SignalKey), or why not
/// (its length, never its text).
fn signal_setting(key: &str, secret: &str) -> Result<lease_core::SignalKey, ConfigError> {
    lease_core::SignalKey::new(secret.as_bytes()).map_err(|e| ConfigError::BadSetting {
        key: key.to_string(),
        reason: e.to_string(),
    })
}

/// The longest namespace: a Postgres identifier's limit.
pub const MAX_NAMESPACE_BYTES: usize = 63;

/// The one namespace rule of every backend (a Postgres schema, a Redis key prefix): 1 to 63
/// ASCII letters, digits, `_`, `-` or `.`. Checked by [`Config::backend`], before connecting.
///
/// # Errors
/// [`ConfigError::BadSetting`] for `namespace`, stating the rule.
pub fn check_namespace(namespace: &str) -> Result<(), ConfigError> {
    let ok = !namespace.is_empty()
        && namespace.len() <= MAX_NAMESPACE_BYTES
        && namespace
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        return Ok(());
    }
    let shown: String = namespace.chars().take(80).collect();
    Err(ConfigError::BadSetting {
        key: "namespace".to_string(),
        reason: format!(
            "{shown:?} is not a valid namespace: it must be 1 to {MAX_NAMESPACE_BYTES} ASCII \
             letters, digits, '_', '-' or '.' (the same rule on every backend)"
        ),
    })
}

/// The largest pool a configuration may ask for.
const MAX_POOL: u64 = 1_000;

fn pool_setting(key: &str, n: u64) -> Result<u32, ConfigError> {
    if !(1..=MAX_POOL).contains(&n) {
        return Err(ConfigError::BadSetting {
            key: key.to_string(),
            reason: format!("{n} connections is out of range; it must be 1 to {MAX_POOL}"),
        });
    }
    Ok(n as u32)
}

fn replica_timeout_setting(key: &str, ms: u64) -> Result<Duration, ConfigError> {
    if ms == 0 {
        return Err(ConfigError::BadSetting {
            key: key.to_string(),
            reason: "the replica timeout must be at least 1 ms".to_string(),
        });
    }
    Ok(Duration::from_millis(ms))
}

fn ttl_setting(key: &str, ms: u64) -> Result<Ttl, ConfigError> {
    Ttl::from_millis(ms).map_err(|e: InvalidInput| ConfigError::BadSetting {
        key: key.to_string(),
        reason: e.to_string(),
    })
}

fn heartbeat_setting(key: &str, ms: u64) -> Result<Duration, ConfigError> {
    if ms == 0 {
        return Err(ConfigError::BadSetting {
            key: key.to_string(),
            reason: "the heartbeat interval must be at least 1 ms".to_string(),
        });
    }
    Ok(Duration::from_millis(ms))
}

impl Config {
    /// The defaults overlaid with a TOML document (keys `store`, `ttl_ms`, `heartbeat_ms`,
    /// `namespace`, `replicas`, `replica_timeout_ms`, `sync_replicas`, `max_connections`,
    /// `migrate`; unknown keys are refused).
    ///
    /// # Errors
    /// [`ConfigError::File`] for bad TOML, [`ConfigError::BadSetting`] for bad values.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        Config::default().merge_toml(text, "<toml>")
    }

    /// The defaults overlaid with the TOML file at `path`.
    ///
    /// # Errors
    /// As [`Config::from_toml`], and [`ConfigError::File`] when the file cannot be read.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Config::default().merge_toml(&text, &path.display().to_string())
    }

    /// The configuration as the `lease` command builds it before reading its flags: the
    /// defaults, then the TOML file at `path` when one is given ([`Config::from_file`]), then
    /// the process environment ([`Config::with_env`]).
    ///
    /// ```
    /// # fn main() -> Result<(), distribution::ConfigError> {
    /// let config = distribution::Config::load(None)?;
    /// println!("{config:?}"); // passwords redacted
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`Config::from_file`] and [`Config::with_env`].
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        match path {
            Some(path) => Config::from_file(path)?,
            None => Config::default(),
        }
        .with_env()
    }

    fn merge_toml(self, text: &str, origin: &str) -> Result<Config, ConfigError> {
        let file: FileConfig = toml::from_str(text).map_err(|e| ConfigError::File {
            path: origin.to_string(),
            // toml quotes the offending line, which may hold a password: keep only the message.
            reason: e.message().to_string(),
        })?;
        self.apply(file)
    }

    fn apply(mut self, file: FileConfig) -> Result<Config, ConfigError> {
        if let Some(store) = file.store {
            self.store = store;
        }
        if let Some(ms) = file.ttl_ms {
            self.ttl = ttl_setting("ttl_ms", ms)?;
        }
        if let Some(ms) = file.heartbeat_ms {
            self.heartbeat = Some(heartbeat_setting("heartbeat_ms", ms)?);
        }
        if let Some(ns) = file.namespace {
            self.namespace = Some(ns);
        }
        if let Some(n) = file.replicas {
            self.replicas = Some(n);
        }
        if let Some(ms) = file.replica_timeout_ms {
            self.replica_timeout = Some(replica_timeout_setting("replica_timeout_ms", ms)?);
        }
        if let Some(n) = file.sync_replicas {
            self.sync_replicas = Some(n);
        }
        if let Some(n) = file.max_connections {
            self.max_connections = Some(pool_setting("max_connections", n)?);
        }
        if let Some(migrate) = file.migrate {
            self.migrate = Some(migrate);
        }
        if let Some(secret) = file.signal_secret {
            self.signal_key = Some(signal_setting("signal_secret", &secret)?);
        }
        Ok(self)
    }

    /// The environment variables [`with_env`](Config::with_env) reads: the store's settings,
    /// `LEASE_STORE` (with its password, if the URL has one) among them. The `lease` command
    /// removes these from the environment of the commands it starts.
    pub const ENV_VARS: &'static [&'static str] = &[
        "LEASE_STORE",
        "LEASE_TTL_MS",
        "LEASE_HEARTBEAT_MS",
        "LEASE_NAMESPACE",
        "LEASE_REPLICAS",
        "LEASE_REPLICA_TIMEOUT_MS",
        "LEASE_SYNC_REPLICAS",
        "LEASE_MAX_CONNECTIONS",
        "LEASE_MIGRATE",
        "LEASE_SIGNAL_SECRET",
    ];

    /// Overlays the process environment: the variables of [`Config::ENV_VARS`].
    ///
    /// # Errors
    /// [`ConfigError::BadSetting`] naming the variable.
    pub fn with_env(self) -> Result<Config, ConfigError> {
        self.with_vars(|key| std::env::var(key).ok())
    }

    /// Overlays variables read through `var` (the environment, in [`Config::with_env`]).
    ///
    /// # Errors
    /// [`ConfigError::BadSetting`] naming the variable.
    pub fn with_vars(
        mut self,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let number = |key: &str| -> Result<Option<u64>, ConfigError> {
            var(key)
                .map(|v| {
                    v.trim()
                        .parse::<u64>()
                        .map_err(|_| ConfigError::BadSetting {
                            key: key.to_string(),
                            reason: format!("{v:?} is not a whole number of milliseconds"),
                        })
                })
                .transpose()
        };
        if let Some(store) = var("LEASE_STORE") {
            self.store = store;
        }
        if let Some(ms) = number("LEASE_TTL_MS")? {
            self.ttl = ttl_setting("LEASE_TTL_MS", ms)?;
        }
        if let Some(ms) = number("LEASE_HEARTBEAT_MS")? {
            self.heartbeat = Some(heartbeat_setting("LEASE_HEARTBEAT_MS", ms)?);
        }
        if let Some(ns) = var("LEASE_NAMESPACE") {
            self.namespace = Some(ns);
        }
        if let Some(v) = var("LEASE_REPLICAS") {
            self.replicas = Some(v.trim().parse().map_err(|_| ConfigError::BadSetting {
                key: "LEASE_REPLICAS".to_string(),
                reason: format!("{v:?} is not a whole number of replicas"),
            })?);
        }
        if let Some(v) = var("LEASE_SYNC_REPLICAS") {
            self.sync_replicas = Some(v.trim().parse().map_err(|_| ConfigError::BadSetting {
                key: "LEASE_SYNC_REPLICAS".to_string(),
                reason: format!("{v:?} is not a whole number of standbys"),
            })?);
        }
        if let Some(v) = var("LEASE_MAX_CONNECTIONS") {
            let n = v.trim().parse().map_err(|_| ConfigError::BadSetting {
                key: "LEASE_MAX_CONNECTIONS".to_string(),
                reason: format!("{v:?} is not a whole number of connections"),
            })?;
            self.max_connections = Some(pool_setting("LEASE_MAX_CONNECTIONS", n)?);
        }
        if let Some(v) = var("LEASE_MIGRATE") {
            self.migrate = Some(match v.trim() {
                "true" | "1" | "yes" => true,
                "false" | "0" | "no" => false,
                _ => {
                    return Err(ConfigError::BadSetting {
                        key: "LEASE_MIGRATE".to_string(),
                        reason: format!("{v:?} is not true or false"),
                    })
                }
            });
        }
        if let Some(ms) = number("LEASE_REPLICA_TIMEOUT_MS")? {
            self.replica_timeout = Some(replica_timeout_setting("LEASE_REPLICA_TIMEOUT_MS", ms)?);
        }
        if let Some(secret) = var("LEASE_SIGNAL_SECRET") {
            self.signal_key = Some(signal_setting("LEASE_SIGNAL_SECRET", &secret)?);
        }
        Ok(self)
    }

    /// Sets the store URL (a flag).
    pub fn with_store(mut self, store: impl Into<String>) -> Config {
        self.store = store.into();
        self
    }

    /// Sets the TTL (a flag).
    pub fn with_ttl(mut self, ttl: Ttl) -> Config {
        self.ttl = ttl;
        self
    }

    /// Sets the heartbeat interval (a flag).
    pub fn with_heartbeat(mut self, heartbeat: Duration) -> Config {
        self.heartbeat = Some(heartbeat);
        self
    }

    /// Sets the namespace (a flag).
    pub fn with_namespace(mut self, namespace: impl Into<String>) -> Config {
        self.namespace = Some(namespace.into());
        self
    }

    /// Redis: requires `replicas` replica acknowledgements before a lease or write is
    /// reported (see `lease_redis::RedisConfig::with_replicas`).
    pub fn with_replicas(mut self, replicas: u32) -> Config {
        self.replicas = Some(replicas);
        self
    }

    /// Postgres: requires `n` synchronous standbys to have every commit that hands out a lease
    /// or accepts a fenced write (see `lease_postgres::PostgresConfig::with_sync_replicas`).
    pub fn with_sync_replicas(mut self, n: u32) -> Config {
        self.sync_replicas = Some(n);
        self
    }

    /// Postgres: the pool size (1 to 1,000).
    ///
    /// # Errors
    /// [`ConfigError::BadSetting`] when out of range.
    pub fn with_max_connections(mut self, n: u32) -> Result<Config, ConfigError> {
        self.max_connections = Some(pool_setting("max_connections", n.into())?);
        Ok(self)
    }

    /// Postgres: whether connecting runs the embedded migrations (see [`Config::migrate`]).
    /// Read-only tools pass `false`, so they never run DDL.
    pub fn with_migrations(mut self, migrate: bool) -> Config {
        self.migrate = Some(migrate);
        self
    }

    /// Redis: how long to wait for replica acknowledgements.
    pub fn with_replica_timeout(mut self, timeout: Duration) -> Config {
        self.replica_timeout = Some(timeout);
        self
    }

    /// The backend this configuration selects, checked without connecting.
    ///
    /// # Errors
    /// [`ConfigError::UnknownScheme`], [`ConfigError::MalformedUrl`].
    pub fn backend(&self) -> Result<Backend, ConfigError> {
        let backend = self.backend_of_url()?;
        if !backend.is_built() {
            return Err(feature_disabled(backend));
        }
        Ok(backend)
    }

    fn backend_of_url(&self) -> Result<Backend, ConfigError> {
        if let Some(ns) = &self.namespace {
            check_namespace(ns)?;
        }
        if self.store.trim().is_empty() {
            return Err(ConfigError::NoStore);
        }
        if self.store == "memory:" || self.store == "memory" {
            return Ok(Backend::Memory);
        }
        // Cluster and Sentinel URLs list several hosts, which the `url` crate cannot parse:
        // the Redis adapter reads them itself, and names any problem at connect.
        if let Some((scheme, rest)) = self.store.split_once("://") {
            let several_hosts = rest
                .split(['/', '?'])
                .next()
                .is_some_and(|a| a.contains(','));
            let backend = match scheme {
                "redis+cluster" | "rediss+cluster" | "redis+sentinel" | "rediss+sentinel" => {
                    Some(Backend::Redis)
                }
                // An endpoint list (`h1:p1,h2:p2`): the etcd adapter reads it.
                "etcd" | "etcds" => Some(Backend::Etcd),
                // A Postgres host list (`h1:p1,h2:p2`): the adapter reads it, and follows the
                // primary among them.
                "postgres" | "postgresql" if several_hosts => Some(Backend::Postgres),
                _ => None,
            };
            if let Some(backend) = backend {
                if rest.is_empty() {
                    return Err(ConfigError::MalformedUrl {
                        url: redact_url(&self.store),
                        reason: "it names no host".to_string(),
                    });
                }
                return Ok(backend);
            }
        }
        let url = url::Url::parse(&self.store).map_err(|e| ConfigError::MalformedUrl {
            url: redact_url(&self.store),
            reason: e.to_string(),
        })?;
        let backend = match url.scheme() {
            // `memory:` takes nothing: a parameter here would be ignored, so it is refused.
            "memory" => {
                let reason = match url.query_pairs().next() {
                    Some((key, _)) => format!(
                        "unknown URL parameter {key:?}: the memory store takes no parameters \
                         (write memory:)"
                    ),
                    None => "the memory store takes no host, path or parameters (write memory:)"
                        .to_string(),
                };
                return Err(ConfigError::MalformedUrl {
                    url: redact_url(&self.store),
                    reason,
                });
            }
            "postgres" | "postgresql" => Backend::Postgres,
            "redis" | "rediss" => Backend::Redis,
            other => {
                return Err(ConfigError::UnknownScheme {
                    scheme: other.to_string(),
                })
            }
        };
        if backend != Backend::Memory && url.host_str().is_none_or(str::is_empty) {
            return Err(ConfigError::MalformedUrl {
                url: redact_url(&self.store),
                reason: "it names no host".to_string(),
            });
        }
        Ok(backend)
    }
}

/// The backends a [`Config`] can select.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Backend {
    /// The embedded memory store.
    Memory,
    /// PostgreSQL (the `postgres` feature).
    Postgres,
    /// Redis (the `redis` feature).
    Redis,
    /// etcd (the `etcd` feature, off by default).
    Etcd,
}

impl Backend {
    /// The backend's name: `memory`, `postgres` or `redis` (the label of its metrics).
    pub fn name(self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Postgres => "postgres",
            Backend::Redis => "redis",
            Backend::Etcd => "etcd",
        }
    }

    /// The Cargo feature of this crate that brings the backend in; `None` for the memory
    /// store, which is always built.
    pub fn feature(self) -> Option<&'static str> {
        match self {
            Backend::Memory => None,
            Backend::Postgres => Some("postgres"),
            Backend::Redis => Some("redis"),
            Backend::Etcd => Some("etcd"),
        }
    }

    /// Whether this build contains the backend.
    pub fn is_built(self) -> bool {
        match self {
            Backend::Memory => true,
            Backend::Postgres => cfg!(feature = "postgres"),
            Backend::Redis => cfg!(feature = "redis"),
            Backend::Etcd => cfg!(feature = "etcd"),
        }
    }
}

fn feature_disabled(backend: Backend) -> ConfigError {
    ConfigError::FeatureDisabled {
        backend: backend.name(),
        feature: backend.feature().unwrap_or(backend.name()),
    }
}

/// Connects to the store `config` selects.
///
/// `memory:` gives a new, empty, in-process store each call, and logs a warning: nothing it
/// holds is seen by another process, so it excludes no other worker. Postgres runs its migrations
/// (serialized by an advisory lock). Redis checks persistence first (see `lease-redis`).
///
/// # Errors
/// [`ConfigError::UnknownScheme`] and [`ConfigError::MalformedUrl`] before any I/O;
/// [`ConfigError::Store`] when the server is unreachable (retryable) or refuses us. No message
/// contains the URL's password.
pub async fn connect(config: &Config) -> Result<Arc<dyn LeaseStore>, ConfigError> {
    Ok(connect_store(config).await?.as_dyn())
}

/// A connected store with its concrete type, for callers that need a backend's own powers
/// (Postgres fenced transactions, Redis fenced scripts).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Store {
    /// The embedded memory store.
    Memory(Arc<MemoryLeaseStore>),
    /// PostgreSQL.
    #[cfg(feature = "postgres")]
    Postgres(Arc<lease_postgres::PostgresLeaseStore>),
    /// Redis.
    #[cfg(feature = "redis")]
    Redis(Arc<lease_redis::RedisLeaseStore>),
    /// etcd.
    #[cfg(feature = "etcd")]
    Etcd(Arc<lease_etcd::EtcdLeaseStore>),
}

impl Store {
    /// The store as the backend-neutral trait object, [instrumented](lease_runtime::Instrumented):
    /// every call is counted and traced under the backend's name (`memory`, `postgres`,
    /// `redis`).
    pub fn as_dyn(&self) -> Arc<dyn LeaseStore> {
        match self {
            Store::Memory(s) => lease_runtime::Instrumented::wrap(s.clone(), "memory"),
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => lease_runtime::Instrumented::wrap(s.clone(), "postgres"),
            #[cfg(feature = "redis")]
            Store::Redis(s) => lease_runtime::Instrumented::wrap(s.clone(), "redis"),
            #[cfg(feature = "etcd")]
            Store::Etcd(s) => lease_runtime::Instrumented::wrap(s.clone(), "etcd"),
        }
    }
}

impl Config {
    /// The Postgres store's configuration this one gives: the store URL, with the namespace
    /// as the schema, `sync_replicas`, `max_connections` and `migrate` when set. What
    /// [`connect`] uses, and operator commands that act on the store without serving it
    /// (`lease pg-rebind`).
    #[cfg(feature = "postgres")]
    pub fn postgres_config(&self) -> lease_postgres::PostgresConfig {
        let mut pg = lease_postgres::PostgresConfig::from_url(self.store.clone());
        if let Some(ns) = &self.namespace {
            pg = pg.with_schema(ns.clone());
        }
        if let Some(n) = self.sync_replicas {
            pg = pg.with_sync_replicas(n);
        }
        if let Some(n) = self.max_connections {
            pg = pg.with_max_connections(n);
        }
        if let Some(migrate) = self.migrate {
            pg = pg.with_migrations(migrate);
        }
        if let Some(key) = &self.signal_key {
            pg = pg.with_signal_key(key.clone());
        }
        pg
    }

    /// The Redis store's configuration this one gives: the store URL, with the namespace,
    /// `replicas` and the replica timeout when set. What [`connect`] uses, and operator
    /// commands that act on the store without serving it (`lease redis-rebind`).
    #[cfg(feature = "redis")]
    pub fn redis_config(&self) -> lease_redis::RedisConfig {
        let mut redis = lease_redis::RedisConfig::from_url(&self.store);
        if let Some(ns) = &self.namespace {
            redis = redis.with_namespace(ns.clone());
        }
        if let Some(n) = self.replicas {
            redis = redis.with_replicas(n);
        }
        if let Some(timeout) = self.replica_timeout {
            redis = redis.with_replica_timeout(timeout);
        }
        if let Some(key) = &self.signal_key {
            redis = redis.with_signal_key(key.clone());
        }
        redis
    }
}

/// [`connect`], keeping the backend's concrete type.
///
/// # Errors
/// As [`connect`].
pub async fn connect_store(config: &Config) -> Result<Store, ConfigError> {
    Ok(match config.backend()? {
        Backend::Memory => {
            tracing::warn!(
                "the store is memory:, a store inside this one process: no other process sees \
                 its runs or its leases, so it excludes no other worker; use postgres://, \
                 redis:// or etcd:// for anything that runs on more than one process"
            );
            let store = MemoryLeaseStore::new();
            Store::Memory(Arc::new(match &config.signal_key {
                Some(key) => store.with_signal_key(key.clone()),
                None => store,
            }))
        }
        #[cfg(feature = "postgres")]
        Backend::Postgres => Store::Postgres(Arc::new(
            lease_postgres::PostgresLeaseStore::connect(config.postgres_config()).await?,
        )),
        #[cfg(feature = "redis")]
        Backend::Redis => Store::Redis(Arc::new(
            lease_redis::RedisLeaseStore::connect(config.redis_config()).await?,
        )),
        #[cfg(feature = "etcd")]
        Backend::Etcd => {
            let mut etcd = lease_etcd::EtcdConfig::from_url(&config.store)?;
            if let Some(ns) = &config.namespace {
                etcd = etcd.with_prefix(ns.clone());
            }
            Store::Etcd(Arc::new(lease_etcd::EtcdLeaseStore::connect(etcd).await?))
        }
        // `backend()` refuses a backend whose feature is off before any I/O.
        #[allow(unreachable_patterns)]
        other => return Err(feature_disabled(other)),
    })
}

#[cfg(test)]
mod tests;
