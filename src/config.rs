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
/// `LEASE_SYNC_REPLICAS`, `LEASE_MAX_CONNECTIONS`, `LEASE_MIGRATE`), then flags (the `with_*` setters).
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
            Store::Memory(Arc::new(MemoryLeaseStore::new()))
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
mod tests {
    use super::*;

    /// There is no default store: a configuration naming none, from the defaults, a file or
    /// the environment, is refused before any I/O with one sentence naming `LEASE_STORE` and
    /// `--store`; `memory:` works only written out.
    #[tokio::test]
    async fn a_configuration_without_a_store_is_refused_naming_lease_store() {
        let unset = |_: &str| None;
        for config in [
            Config::default(),
            Config::default().with_vars(unset).unwrap(),
            Config::from_toml("ttl_ms = 5000\nnamespace = \"billing\"\n").unwrap(),
            Config::default().with_store("  "),
        ] {
            let err = config.backend().unwrap_err();
            assert!(matches!(err, ConfigError::NoStore), "{err:?}");
            let message = err.to_string();
            assert!(
                message.contains("LEASE_STORE") && message.contains("--store"),
                "{message}"
            );
            assert!(matches!(connect(&config).await, Err(ConfigError::NoStore)));
        }
        let memory = Config::default().with_store("memory:");
        assert_eq!(memory.backend().unwrap(), Backend::Memory);
        assert!(connect(&memory).await.is_ok());
    }

    /// Run by CI with `--no-default-features --features postgres` (and `redis`): a URL of a
    /// backend left out of the build is refused before any I/O, naming the feature.
    #[test]
    fn a_url_of_a_backend_left_out_names_its_feature() {
        let urls = [
            (Backend::Postgres, "postgres://app:hunter2@db/runs"),
            (Backend::Redis, "redis://:hunter2@cache:6379"),
            (Backend::Redis, "redis+cluster://:hunter2@a:1,b:2"),
            (Backend::Etcd, "etcd://app:hunter2@a:2379,b:2379/jobs"),
            (Backend::Etcd, "etcd://a:2379"),
        ];
        for (backend, url) in urls {
            let config = Config::default().with_store(url);
            match config.backend() {
                Ok(found) => {
                    assert!(backend.is_built(), "{url} accepted by a build without it");
                    assert_eq!(found, backend);
                }
                Err(ConfigError::FeatureDisabled {
                    backend: name,
                    feature,
                }) => {
                    assert!(!backend.is_built(), "{url} refused by a build with it");
                    assert_eq!(Some(feature), backend.feature());
                    let message = config.backend().unwrap_err().to_string();
                    assert!(
                        message.contains(&format!("`{feature}` feature")) && message.contains(name),
                        "{message}"
                    );
                    assert!(!message.contains("hunter2"), "{message}");
                }
                Err(other) => panic!("{url}: {other}"),
            }
        }
        assert!(Backend::Memory.is_built() && Backend::Memory.feature().is_none());
    }

    /// Run by CI with `--no-default-features --features postgres`: without a TLS feature, a
    /// URL that demands TLS is refused before any I/O, naming the features (not left to fail
    /// at the handshake with a driver message).
    #[cfg(all(
        feature = "postgres",
        not(any(feature = "tls-rustls", feature = "tls-native-tls"))
    ))]
    #[tokio::test]
    async fn a_url_that_needs_tls_names_the_tls_features_in_a_build_without_them() {
        let config =
            Config::default().with_store("postgres://app:hunter2@127.0.0.1:1/db?sslmode=require");
        let err = connect(&config).await.expect_err("TLS is not built");
        let message = err.to_string();
        assert!(
            matches!(
                &err,
                ConfigError::Store(lease_core::Error::Misconfigured { .. })
            ) && message.contains("`tls-rustls` or `tls-native-tls` feature")
                && !message.contains("hunter2"),
            "{message}"
        );
    }

    #[test]
    fn config_nests_in_an_application_config_with_every_check() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct App {
            lease: Config,
        }
        let app: App = toml::from_str(
            "[lease]\nstore = \"postgres://app:pw@db/x\"\nttl_ms = 1500\nmax_connections = 4\nmigrate = false\n",
        )
        .unwrap();
        assert_eq!(
            (
                app.lease.ttl.as_millis(),
                app.lease.max_connections,
                app.lease.migrate
            ),
            (1500, Some(4), Some(false))
        );
        // The same checks as the file: a TTL out of range and an unknown key are refused.
        let bad = toml::from_str::<App>("[lease]\nttl_ms = 0\n")
            .unwrap_err()
            .to_string();
        assert!(bad.contains("ttl_ms"), "{bad}");
        let unknown = toml::from_str::<App>("[lease]\nstore = \"memory:\"\nttl = 5\n")
            .unwrap_err()
            .to_string();
        assert!(unknown.contains("unknown field `ttl`"), "{unknown}");
        let env = Config::default()
            .with_vars(|k| (k == "LEASE_MIGRATE").then(|| "maybe".to_string()))
            .unwrap_err();
        assert!(env.to_string().contains("LEASE_MIGRATE"), "{env}");
    }

    /// `ENV_VARS` names every variable the configuration reads, and no other: the `lease`
    /// command keeps exactly these from its children.
    #[test]
    fn env_vars_are_the_variables_read() {
        let asked = std::sync::Mutex::new(Vec::new());
        Config::default()
            .with_vars(|k| {
                asked.lock().unwrap().push(k.to_owned());
                None
            })
            .unwrap();
        let mut asked = asked.into_inner().unwrap();
        let mut listed: Vec<String> = Config::ENV_VARS.iter().map(|v| v.to_string()).collect();
        asked.sort();
        listed.sort();
        assert_eq!(asked, listed);
    }

    #[test]
    fn precedence_is_file_then_env_then_flags() {
        let file = Config::from_toml("store = \"redis://file\"\nttl_ms = 1000\nnamespace = \"f\"")
            .unwrap();
        let env = file
            .with_vars(|k| match k {
                "LEASE_STORE" => Some("postgres://env/db".into()),
                "LEASE_TTL_MS" => Some("2000".into()),
                _ => None,
            })
            .unwrap();
        assert_eq!(
            (
                env.store.as_str(),
                env.ttl.as_millis(),
                env.namespace.as_deref()
            ),
            ("postgres://env/db", 2000, Some("f"))
        );
        let flags = env.with_store("memory:");
        assert_eq!(flags.backend().unwrap(), Backend::Memory);
    }

    #[test]
    fn load_reads_the_file_when_given_and_names_a_missing_one() {
        let path = std::env::temp_dir().join(format!("lease-load-{}.toml", std::process::id()));
        std::fs::write(&path, "max_connections = 7\nttl_ms = 4321\n").unwrap();
        let loaded = Config::load(Some(&path));
        std::fs::remove_file(&path).unwrap();
        let loaded = loaded.unwrap();
        // The environment may override these only through LEASE_* variables, unset in tests.
        assert_eq!(
            (loaded.max_connections, loaded.ttl.as_millis()),
            (Some(7), 4321)
        );
        match Config::load(Some(&path)) {
            Err(ConfigError::File { path: named, .. }) => {
                assert_eq!(named, path.display().to_string())
            }
            other => panic!("a missing file must be ConfigError::File, got {other:?}"),
        }
    }

    // Needs both backends built (the default features).
    #[cfg(all(feature = "postgres", feature = "redis"))]
    #[test]
    fn replica_settings_come_from_file_and_environment() {
        let config =
            Config::from_toml("replicas = 1\nreplica_timeout_ms = 250\nsync_replicas = 2").unwrap();
        assert_eq!(config.replicas, Some(1));
        assert_eq!(config.replica_timeout, Some(Duration::from_millis(250)));
        assert_eq!(config.sync_replicas, Some(2));
        let env = |key: &str| match key {
            "LEASE_REPLICAS" => Some("2".to_string()),
            "LEASE_SYNC_REPLICAS" => Some("one".to_string()),
            _ => None,
        };
        let err = Config::default().with_vars(env).unwrap_err();
        assert!(err.to_string().contains("LEASE_SYNC_REPLICAS"), "{err}");
        assert!(Config::from_toml("replica_timeout_ms = 0").is_err());
        let cluster = Config::default().with_store("redis+cluster://:pw@h1:1,h2:2");
        assert_eq!(cluster.backend().unwrap(), Backend::Redis);
        assert!(!format!("{cluster:?}").contains("pw"));
        let hosts = Config::default().with_store("postgres://app:pw@h1:5432,h2:5433/runs");
        assert_eq!(hosts.backend().unwrap(), Backend::Postgres);
        assert!(!format!("{hosts:?}").contains("pw"));
    }

    #[test]
    fn the_pool_size_comes_from_file_environment_or_flag_within_range() {
        let config = Config::from_toml("max_connections = 32").unwrap();
        assert_eq!(config.max_connections, Some(32));
        let config = config
            .with_vars(|k| (k == "LEASE_MAX_CONNECTIONS").then(|| "48".into()))
            .unwrap();
        assert_eq!(config.max_connections, Some(48));
        assert_eq!(
            config.with_max_connections(16).unwrap().max_connections,
            Some(16)
        );
        for bad in ["max_connections = 0", "max_connections = 1001"] {
            let err = Config::from_toml(bad).unwrap_err();
            assert!(
                matches!(&err, ConfigError::BadSetting { key, reason } if key == "max_connections" && reason.contains("1 to 1000")),
                "{bad}: {err}"
            );
        }
        let err = Config::default()
            .with_vars(|k| (k == "LEASE_MAX_CONNECTIONS").then(|| "many".into()))
            .unwrap_err();
        assert!(
            matches!(&err, ConfigError::BadSetting { key, .. } if key == "LEASE_MAX_CONNECTIONS")
        );
        assert!(Config::default().with_max_connections(0).is_err());
    }

    // Needs both backends built (the default features).
    #[cfg(all(feature = "postgres", feature = "redis"))]
    #[test]
    fn one_namespace_rule_on_every_backend() {
        for store in [
            "memory:",
            "postgres://app@db/runs",
            "redis://127.0.0.1:6379",
        ] {
            for bad in ["a}b", "{a}", "a:b", "a b", "", "ünï", &"n".repeat(64)] {
                let err = Config::default()
                    .with_store(store)
                    .with_namespace(bad)
                    .backend()
                    .unwrap_err();
                assert!(
                    matches!(&err, ConfigError::BadSetting { key, reason } if key == "namespace" && reason.contains("1 to 63 ASCII letters")),
                    "{store} {bad:?}: {err}"
                );
            }
            for good in ["billing", "tenant-7.prod_eu", &"n".repeat(63)] {
                Config::default()
                    .with_store(store)
                    .with_namespace(good)
                    .backend()
                    .unwrap_or_else(|e| panic!("{store} {good:?}: {e}"));
            }
        }
    }

    #[test]
    fn bad_settings_name_their_source() {
        let err = Config::default()
            .with_vars(|k| (k == "LEASE_TTL_MS").then(|| "0".into()))
            .unwrap_err();
        assert!(
            matches!(&err, ConfigError::BadSetting { key, .. } if key == "LEASE_TTL_MS"),
            "{err}"
        );
        let err = Config::default()
            .with_vars(|k| (k == "LEASE_TTL_MS").then(|| "soon".into()))
            .unwrap_err();
        assert!(err.to_string().contains("LEASE_TTL_MS"), "{err}");
        assert!(matches!(
            Config::from_toml("stroe = \"memory:\""),
            Err(ConfigError::File { .. })
        ));
    }

    #[test]
    fn the_leaking_urls_of_issue_14_are_redacted_in_debug_and_display() {
        for (url, expected) in [
            (
                "redis+unix:///tmp/r.sock?pass=hunter2",
                "redis+unix:///tmp/r.sock?pass=******",
            ),
            ("redis://:hun/ter2@h:6379", "redis://:******@h:6379"),
            ("redis://:hun#ter2@h:6379", "redis://:******"),
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
            (
                "redis://h:6379?api_token=hunter2",
                "redis://h:6379?api_token=******",
            ),
            (
                "redis://h:6379?PASSWORD=hunter2",
                "redis://h:6379?PASSWORD=******",
            ),
        ] {
            assert_eq!(redact_url(url), expected, "{url}");
            let config = Config::default().with_store(url);
            let debug = format!("{config:?}");
            assert!(debug.contains(&format!("{expected:?}")), "{debug}");
            assert!(config.to_string().starts_with(expected), "{config}");
            let err = config
                .backend()
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            for shown in [debug, config.to_string(), err] {
                assert!(!shown.contains("hun"), "{shown}");
            }
        }
    }

    // Needs both backends built (the default features).
    #[cfg(all(feature = "postgres", feature = "redis"))]
    /// Every backend refuses a parameter it does not document, naming it, before any I/O
    /// (port 1 is never dialled: the URL is refused first).
    #[tokio::test]
    async fn unknown_url_parameters_are_refused_by_name_on_every_backend() {
        let err = Config::default()
            .with_store("memory:?replicas=1")
            .backend()
            .unwrap_err();
        assert!(
            matches!(&err, ConfigError::MalformedUrl { reason, .. } if reason.contains("\"replicas\"")),
            "{err}"
        );
        for (store, named) in [
            (
                "postgres://app:pw1234@127.0.0.1:1/db?volatle=true",
                "\"volatle\"",
            ),
            ("postgres://app@127.0.0.1:1/db?pass=pw1234", "\"pass\""),
            (
                "postgres://app@127.0.0.1:1/db?PASSWORD=pw1234",
                "\"PASSWORD\"",
            ),
            (
                "postgres://app:pw1234@127.0.0.1:1,127.0.0.2:1/db?replicas=1",
                "\"replicas\"",
            ),
            (
                "redis://:pw1234@127.0.0.1:1?sync_replicas=1",
                "\"sync_replicas\"",
            ),
            ("redis://127.0.0.1:1?password=pw1234", "\"password\""),
            (
                "redis+cluster://:pw1234@127.0.0.1:1,127.0.0.1:2?volatle=true",
                "\"volatle\"",
            ),
            (
                "redis+sentinel://127.0.0.1:1/svc?api_token=pw1234",
                "\"api_token\"",
            ),
        ] {
            let err = connect(&Config::default().with_store(store))
                .await
                .err()
                .unwrap_or_else(|| panic!("{store} was accepted"));
            assert!(
                matches!(
                    &err,
                    ConfigError::Store(lease_core::Error::Misconfigured { .. })
                ),
                "{store}: {err:?}"
            );
            assert!(!err.is_retryable());
            let shown = format!("{err} {err:?}");
            assert!(shown.contains(named), "{store}: {shown}");
            assert!(!shown.contains("pw1234"), "{store}: {shown}");
        }
    }

    #[test]
    fn urls_are_classified_without_echoing_passwords() {
        let cfg = Config::default().with_store("mysql://u:secret@h/db");
        let err = cfg.backend().unwrap_err();
        assert!(matches!(&err, ConfigError::UnknownScheme { scheme } if scheme == "mysql"));
        let cfg = Config::default().with_store("postgres://u:secret@/db");
        let err = cfg.backend().unwrap_err();
        assert!(matches!(err, ConfigError::MalformedUrl { .. }), "{err}");
        assert!(!err.to_string().contains("secret"), "{err}");
        let err = Config::default()
            .with_store("not a url :secret@")
            .backend()
            .unwrap_err();
        assert!(!err.to_string().contains("secret"), "{err}");
        assert_eq!(
            redact_url("redis://:s3cr3t@localhost:6379/0"),
            "redis://:******@localhost:6379/0"
        );
        assert!(!format!("{:?}", Config::default().with_store("rediss://u:pw@h")).contains("pw@"));
    }
}
