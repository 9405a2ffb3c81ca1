//! How to reach Redis: topology (one server, Cluster, Sentinel), namespace, durability
//! settings, timeouts.

use std::fmt;
use std::time::Duration;

use lease_core::redact_url;

use crate::error::RedisError;

/// Where and how a [`RedisLeaseStore`](crate::RedisLeaseStore) connects.
///
/// Built from a URL, then adjusted with the `with_*` methods. Three forms select the topology:
///
/// | URL | connects to |
/// |---|---|
/// | `redis://[user:password@]host[:port][/db]`, `rediss://…` (TLS) | one server |
/// | `redis+cluster://[user:password@]host:port,host:port,…`, `rediss+cluster://…` | a Redis Cluster, through any of the listed nodes; commands follow the slot map |
/// | `redis+sentinel://[user:password@]host:port,host:port,…/SERVICE[/db]`, `rediss+sentinel://…` | the current primary of `SERVICE`, asked of the listed Sentinels again after every failover |
///
/// The user and password are those of the Redis servers (not of the Sentinels). Query
/// parameters, all optional; any other parameter is refused at connect, so a misspelt
/// protection never silently does nothing:
///
/// | parameter | meaning |
/// |---|---|
/// | `replicas=N` | hand out a lease, or report a write as done, only once `N` replicas acknowledged it (`WAIT`); see [`with_replicas`](RedisConfig::with_replicas) |
/// | `replica_timeout_ms=T` | how long to wait for those acknowledgements (default 1000) |
/// | `volatile=true` | accept a server on which an acknowledged claim can be lost; see [`with_volatile`](RedisConfig::with_volatile) |
/// | `async_replicas=accept` | accept replicas attached to a plain `redis://` master with `replicas=0`, and only that; see [`with_async_replicas_accepted`](RedisConfig::with_async_replicas_accepted) |
/// | `fsync=asserted` | on a server whose `CONFIG` cannot be read (managed Redis), the operator asserts `appendonly yes`, `appendfsync always` and `maxmemory-policy noeviction`, and only that is taken on trust; see [`with_fsync_asserted`](RedisConfig::with_fsync_asserted) |
/// | `protocol=resp2` or `resp3` | the wire protocol (default RESP2) |
/// | `wake_ups=false` | workers poll instead of subscribing to wake-ups; see [`with_wake_ups`](RedisConfig::with_wake_ups) |
/// | `db=N`, `user=U`, `pass=P` | socket URLs only (`redis+unix:///path`, `unix:///path`), read by redis-rs: the database and credentials |
///
/// A password is percent-encoded in the user info (`/` as `%2F`, `?` as `%3F`, `#` as `%23`,
/// `@` as `%40`); a raw `/` before the `@`, a `#`, or a raw `@` after the `?` is refused, since
/// redis-rs would read the URL differently from its author.
///
/// `Debug` and `Display` print the password as `******`.
///
/// ```
/// use lease_redis::RedisConfig;
/// let config = RedisConfig::from_url("redis+cluster://:hunter2@10.0.0.1:7000,10.0.0.2:7000?replicas=1")
///     .with_namespace("billing");
/// assert!(!format!("{config:?}").contains("hunter2"));
/// assert_eq!(config.namespace(), "billing");
/// assert_eq!(config.replicas(), 1);
/// ```
#[derive(Clone)]
pub struct RedisConfig {
    /// The URL as given, for display (redacted) only.
    given: String,
    topology: Result<Topology, String>,
    namespace: String,
    volatile: bool,
    wake_ups: bool,
    async_replicas: bool,
    fsync_asserted: bool,
    replicas: u32,
    replica_timeout: Duration,
    response_timeout: Duration,
    connect_timeout: Duration,
    pub(crate) signal_key: Option<lease_core::SignalKey>,
}

/// Which servers to talk to, parsed from the URL.
#[derive(Clone)]
pub(crate) enum Topology {
    /// One server; the URL is handed to redis-rs as it is (without our parameters).
    Single { url: String },
    /// A Cluster: one redis-rs URL per seed node, each carrying the credentials.
    Cluster {
        nodes: Vec<String>,
        protocol: Option<Protocol>,
    },
    /// A primary found through Sentinels.
    Sentinel {
        sentinels: Vec<(String, u16)>,
        service: String,
        tls: bool,
        db: i64,
        /// `user:password` exactly as written in the URL (still percent-encoded), if any.
        userinfo: Option<String>,
        protocol: Option<Protocol>,
    },
}

/// The wire protocol asked for with `protocol=`.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Protocol {
    Resp2,
    Resp3,
}

impl RedisConfig {
    /// The namespace used unless [`with_namespace`](RedisConfig::with_namespace) says otherwise.
    pub const DEFAULT_NAMESPACE: &'static str = "default";
    /// How long a command may wait for its reply unless configured otherwise.
    pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
    /// How long a connection attempt may take unless configured otherwise.
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
    /// How long to wait for replica acknowledgements unless configured otherwise.
    pub const DEFAULT_REPLICA_TIMEOUT: Duration = Duration::from_secs(1);

    /// A configuration for `url` (see the table above). Never fails: a URL that cannot be
    /// used is reported by [`RedisLeaseStore::connect`](crate::RedisLeaseStore::connect) as
    /// [`Error::Misconfigured`](lease_core::Error::Misconfigured), naming what is wrong.
    pub fn from_url(url: impl AsRef<str>) -> RedisConfig {
        let given = url.as_ref().to_owned();
        let mut config = RedisConfig {
            given: given.clone(),
            topology: Err(String::new()),
            namespace: Self::DEFAULT_NAMESPACE.to_owned(),
            volatile: false,
            wake_ups: true,
            async_replicas: false,
            fsync_asserted: false,
            replicas: 0,
            replica_timeout: Self::DEFAULT_REPLICA_TIMEOUT,
            response_timeout: Self::DEFAULT_RESPONSE_TIMEOUT,
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            signal_key: None,
        };
        config.topology = config.parse(&given);
        config
    }

    fn parse(&mut self, url: &str) -> Result<Topology, String> {
        let shown = redact_url(url);
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(format!(
                "{shown} is not a URL: expected redis://, rediss://, \
                                redis+cluster:// or redis+sentinel://"
            ));
        };
        let (rest, fragment) = match rest.split_once('#') {
            Some((rest, _)) => (rest, true),
            None => (rest, false),
        };
        if fragment {
            return Err(format!(
                "{shown}: a '#' is not allowed in the URL (percent-encode it \
                                as %23 in a password)"
            ));
        }
        let (body, query) = match rest.split_once('?') {
            Some((body, query)) => (body, query),
            None => (rest, ""),
        };
        if query.contains('@') {
            return Err(format!(
                "{shown}: a raw '@' after the '?' is ambiguous; percent-encode it as %40 in a \
                 parameter value (and a '?' in a password as %3F)"
            ));
        }
        // A socket URL (`redis+unix:///path`) has no host, and its credentials and database
        // are parameters that redis-rs reads: `db`, `user`, `pass`.
        let socket = matches!(scheme, "redis+unix" | "unix");
        if !socket && body.contains('@') && body[..body.rfind('@').unwrap_or(0)].contains('/') {
            return Err(format!(
                "{shown}: a '/' before the '@' of the user info; percent-encode it as %2F in a \
                 user name or password"
            ));
        }
        let mut protocol = None;
        let mut passed = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "volatile" => {
                    self.volatile = match value {
                        "true" | "1" | "yes" => true,
                        "false" | "0" | "no" => false,
                        _ => return Err(format!("volatile={value:?}: expected true or false")),
                    }
                }
                "wake_ups" => {
                    self.wake_ups = match value {
                        "true" | "1" | "yes" => true,
                        "false" | "0" | "no" => false,
                        _ => return Err(format!("wake_ups={value:?}: expected true or false")),
                    }
                }
                "async_replicas" => {
                    self.async_replicas = match value {
                        "accept" => true,
                        "refuse" => false,
                        _ => {
                            return Err(format!(
                                "async_replicas={value:?}: expected accept (replicas that \
                                 acknowledge nothing may be attached and are never promoted) or \
                                 refuse"
                            ))
                        }
                    }
                }
                "fsync" => {
                    self.fsync_asserted = match value {
                        "asserted" => true,
                        _ => {
                            return Err(format!(
                                "fsync={value:?}: expected asserted (the server's CONFIG cannot \
                                 be read, and its operator asserts appendonly yes, appendfsync \
                                 always and maxmemory-policy noeviction)"
                            ))
                        }
                    }
                }
                "replicas" => {
                    self.replicas = value.parse().map_err(|_| {
                        format!("replicas={value:?}: expected a number of replicas (0 or more)")
                    })?
                }
                "replica_timeout_ms" => {
                    let ms: u64 = value.parse().ok().filter(|ms| *ms > 0).ok_or_else(|| {
                        format!("replica_timeout_ms={value:?}: expected a positive number of milliseconds")
                    })?;
                    self.replica_timeout = Duration::from_millis(ms);
                }
                "protocol" => {
                    protocol = Some(match value {
                        "resp2" | "2" => Protocol::Resp2,
                        "resp3" | "3" => Protocol::Resp3,
                        _ => return Err(format!("protocol={value:?}: expected resp2 or resp3")),
                    });
                    passed.push(pair);
                }
                "db" | "user" | "pass" if socket => passed.push(pair),
                _ => {
                    let hint = if key.to_ascii_lowercase().contains("pass") {
                        " (a password goes in the user info: redis://:PASSWORD@host, or \
                         redis://USER:PASSWORD@host)"
                    } else {
                        ""
                    };
                    let socket_too = if socket { ", db, user, pass" } else { "" };
                    return Err(format!(
                        "unknown URL parameter {key:?}{hint}: the redis adapter understands \
                         replicas, replica_timeout_ms, volatile, async_replicas, fsync, protocol, wake_ups{socket_too}"
                    ));
                }
            }
        }
        let (authority, path) = match body.find('/') {
            // A password may contain '/' only percent-encoded; the authority ends at the first
            // '/' after the last '@'.
            _ if body.contains('@') => {
                let at = body.rfind('@').unwrap_or(0);
                match body[at..].find('/') {
                    Some(slash) => body.split_at(at + slash),
                    None => (body, ""),
                }
            }
            Some(slash) => body.split_at(slash),
            None => (body, ""),
        };
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo.to_owned()), hosts),
            None => (None, authority),
        };
        let with_query = |base: String| {
            if passed.is_empty() {
                base
            } else {
                format!("{base}?{}", passed.join("&"))
            }
        };
        if scheme.starts_with("rediss")
            && !cfg!(any(feature = "tls-rustls", feature = "tls-native-tls"))
        {
            return Err(format!(
                "{shown} asks for TLS, which this build of lease-redis leaves out: enable its \
                 `tls-rustls` or `tls-native-tls` feature (through the distribution crate, the \
                 feature of the same name)"
            ));
        }
        match scheme {
            "redis" | "rediss" | "redis+unix" | "unix" => Ok(Topology::Single {
                url: with_query(format!("{scheme}://{body}")),
            }),
            "redis+cluster" | "rediss+cluster" => {
                if !path.is_empty() && path != "/" {
                    return Err(format!(
                        "{shown}: a cluster URL has no database or path \
                                        (Redis Cluster has only database 0)"
                    ));
                }
                let node_scheme = scheme.trim_end_matches("+cluster");
                let nodes = split_hosts(hosts, &shown)?
                    .into_iter()
                    .map(|(host, port)| {
                        (
                            if host.contains(':') {
                                format!("[{host}]")
                            } else {
                                host
                            },
                            port,
                        )
                    })
                    .map(|(host, port)| match &userinfo {
                        Some(userinfo) => format!("{node_scheme}://{userinfo}@{host}:{port}"),
                        None => format!("{node_scheme}://{host}:{port}"),
                    })
                    .collect();
                Ok(Topology::Cluster { nodes, protocol })
            }
            "redis+sentinel" | "rediss+sentinel" => {
                let mut parts = path.trim_start_matches('/').split('/');
                let service = parts.next().unwrap_or_default().to_owned();
                if service.is_empty() {
                    return Err(format!(
                        "{shown}: a sentinel URL names its service: \
                                        redis+sentinel://host:port,…/SERVICE"
                    ));
                }
                let db = match parts.next() {
                    None | Some("") => 0,
                    Some(db) => db
                        .parse()
                        .map_err(|_| format!("{shown}: database {db:?} is not a number"))?,
                };
                if parts.next().is_some() {
                    return Err(format!(
                        "{shown}: expected /SERVICE or /SERVICE/db after the hosts"
                    ));
                }
                Ok(Topology::Sentinel {
                    sentinels: split_hosts(hosts, &shown)?,
                    service,
                    tls: scheme.starts_with("rediss"),
                    db,
                    userinfo,
                    protocol,
                })
            }
            other => Err(format!(
                "unknown scheme {other:?} in {shown}: use redis://, rediss://, redis+cluster:// \
                 or redis+sentinel://"
            )),
        }
    }

    /// Uses `namespace` (1 to 64 ASCII letters, digits, `_`, `-`, `.`; checked at connect) as
    /// the key prefix, so tenants sharing a server never see each other's runs. All keys of a
    /// namespace live in one Cluster hash slot: a Cluster spreads namespaces, not runs.
    pub fn with_namespace(mut self, namespace: impl Into<String>) -> RedisConfig {
        self.namespace = namespace.into();
        self
    }

    /// Signs and checks [`SignalToken`](lease_core::SignalToken)s with `key` (see
    /// [`SignalKey`](lease_core::SignalKey)).
    pub fn with_signal_key(mut self, key: lease_core::SignalKey) -> RedisConfig {
        self.signal_key = Some(key);
        self
    }

    /// Accepts (`true`) or refuses (`false`, the default) a server on which an acknowledged
    /// claim can be lost, so that **a fence may be issued twice after a crash, an eviction or a
    /// failover**: AOF off, `appendfsync` other than `always`, `no-appendfsync-on-rewrite
    /// yes`, an `allkeys-*` eviction policy, a `CONFIG` command the adapter may not run (so it
    /// cannot tell), or a topology that fails over (Sentinel, a Cluster with replicas) without
    /// [`with_replicas`](RedisConfig::with_replicas). With `true` the store connects anyway, logs one warning
    /// naming the settings it accepted, and shows them in its `Display`.
    pub fn with_volatile(mut self, volatile: bool) -> RedisConfig {
        self.volatile = volatile;
        self
    }

    /// Whether the store's workers are woken by pub/sub (`true`, the default) or only poll
    /// (`false`; the URL's `wake_ups=false`). With wake-ups, every script that makes a run
    /// claimable publishes its class on the namespace's channel (`{lease:<ns>}:wake`), and the
    /// first [`Worker`](lease_runtime::Worker) of a store opens one subscribed connection for all
    /// of the store's workers: to the server, to the primary the Sentinels name, or to a
    /// Cluster seed node (a Cluster forwards every `PUBLISH` to all its nodes). The messages
    /// are sent either way: with no subscriber, a `PUBLISH` costs the script a lookup. An ACL
    /// user needs the channel (`&{lease:<ns>}:wake`, or `&*`; Redis 7 gives new users no
    /// channel by default): without it the scripts' publishes are skipped, never failing the
    /// write, and the workers, unable to subscribe, poll.
    pub fn with_wake_ups(mut self, on: bool) -> RedisConfig {
        self.wake_ups = on;
        self
    }

    /// Whether wake-ups are on.
    pub fn wake_ups(&self) -> bool {
        self.wake_ups
    }

    /// Accepts (`true`) or refuses (`false`, the default) replicas attached to a plain
    /// `redis://` master while [`replicas`](RedisConfig::with_replicas) is 0: such a master is
    /// refused at connect and on every new connection (`INFO replication` shows
    /// `connected_slaves`), because a replica promoted after a failure lacks the last claims
    /// the master acknowledged and **issues their fences again**. Accept this one risk, and no
    /// other, for read replicas that are never promoted while the store runs; otherwise set
    /// `replicas=N`. What was accepted shows in `Display` and
    /// [`accepted_risks`](crate::RedisLeaseStore::accepted_risks).
    pub fn with_async_replicas_accepted(mut self, accept: bool) -> RedisConfig {
        self.async_replicas = accept;
        self
    }

    /// For a server whose `CONFIG GET` is not permitted (most managed Redis offerings block
    /// `CONFIG`): the operator asserts that it runs with `appendonly yes`, `appendfsync always`
    /// and `maxmemory-policy noeviction` (or its offering's equivalent: every write on disk
    /// before it is acknowledged, no key ever evicted), and the store takes exactly that on
    /// trust. Everything it can still see is checked as ever: a replica attached without
    /// [`replicas`](RedisConfig::with_replicas) (`INFO replication`), a Sentinel or Cluster
    /// topology without acknowledgements, and, where `CONFIG GET` does answer, every setting it
    /// reads (the assertion then changes nothing). What was asserted shows in `Display`, in
    /// [`accepted_risks`](crate::RedisLeaseStore::accepted_risks) and in one warning. URL
    /// parameter `fsync=asserted`.
    pub fn with_fsync_asserted(mut self, asserted: bool) -> RedisConfig {
        self.fsync_asserted = asserted;
        self
    }

    /// Whether the operator asserts the durability settings the store cannot read.
    pub fn asserts_fsync(&self) -> bool {
        self.fsync_asserted
    }

    /// Whether replicas that acknowledge nothing are accepted.
    pub fn accepts_async_replicas(&self) -> bool {
        self.async_replicas
    }

    /// Hands out a lease (claim, `claim_next`), renews it, and reports a fenced write
    /// (append, release, suspend, complete, a fenced script) as done only once `replicas`
    /// replicas confirmed it with `WAIT`; otherwise the call fails with a retryable
    /// [`Error::Unavailable`](lease_core::Error::Unavailable) and the caller never gets the
    /// lease. `0` (the default) waits for no replica. With `1` or more, a replica promoted
    /// after a failover has every lease that was handed out, so it never issues a fence twice
    /// (as long as fewer than `replicas` replicas are lost together). An answer about the
    /// caller's own fence that a retry would take for its commit (the lease already ended
    /// under it) is confirmed the same way. Required (or `volatile`) behind Sentinel and on a
    /// Cluster that has replicas.
    pub fn with_replicas(mut self, replicas: u32) -> RedisConfig {
        self.replicas = replicas;
        self
    }

    /// How long to wait for the replica acknowledgements of
    /// [`with_replicas`](RedisConfig::with_replicas) (default 1 s). Must be shorter than the
    /// response timeout.
    pub fn with_replica_timeout(mut self, timeout: Duration) -> RedisConfig {
        self.replica_timeout = timeout;
        self
    }

    /// How long a command waits for its reply before failing with a retryable error.
    pub fn with_response_timeout(mut self, timeout: Duration) -> RedisConfig {
        self.response_timeout = timeout;
        self
    }

    /// How long a connection attempt may take before failing with a retryable error.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> RedisConfig {
        self.connect_timeout = timeout;
        self
    }

    /// The namespace (key prefix).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Whether a server that can lose an acknowledged claim is accepted.
    pub fn is_volatile(&self) -> bool {
        self.volatile
    }

    /// How many replicas must acknowledge a lease before it is handed out.
    pub fn replicas(&self) -> u32 {
        self.replicas
    }

    /// How long to wait for replica acknowledgements.
    pub fn replica_timeout(&self) -> Duration {
        self.replica_timeout
    }

    /// Settings for [`RedisLeaseStore::from_client`](crate::RedisLeaseStore::from_client),
    /// whose connections come from the caller's client: the defaults of
    /// [`from_url`](Self::from_url), changed with the `with_*` setters.
    pub fn for_client() -> RedisConfig {
        RedisConfig::from_url("redis://client")
    }

    /// This configuration on the server `client` connects to: shown by its address (never its
    /// password); a Cluster or Sentinel configuration is refused.
    pub(crate) fn with_client_address(
        mut self,
        client: &redis::Client,
    ) -> Result<RedisConfig, RedisError> {
        if !matches!(self.topology()?, Topology::Single { .. }) {
            return Err(RedisError::Config(
                "from_client takes a client of one server; for a Cluster or a Sentinel-managed \
                 primary connect with a redis+cluster:// or redis+sentinel:// URL, so the store \
                 builds a client that never resends a write"
                    .to_owned(),
            ));
        }
        let info = client.get_connection_info();
        self.given = format!("redis://{}/{}", info.addr(), info.redis_settings().db());
        Ok(self)
    }

    pub(crate) fn topology(&self) -> Result<&Topology, RedisError> {
        self.topology
            .as_ref()
            .map_err(|why| RedisError::Config(why.clone()))
    }

    pub(crate) fn response_timeout(&self) -> Duration {
        self.response_timeout
    }

    pub(crate) fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    pub(crate) fn check(&self) -> Result<(), RedisError> {
        self.topology()?;
        for (name, value) in [
            ("replica timeout", self.replica_timeout),
            ("response timeout", self.response_timeout),
            ("connect timeout", self.connect_timeout),
        ] {
            // Under 1 ms a replica timeout would be sent as WAIT N 0, which blocks forever.
            if value < Duration::from_millis(1) || value > Duration::from_secs(86_400) {
                return Err(RedisError::Config(format!(
                    "the {name} of {value:?} is out of range: it must be 1 ms to 1 day (a replica \
                     timeout under 1 ms would be sent as WAIT N 0, which waits forever)"
                )));
            }
        }
        if self.replicas > 0 && self.replica_timeout >= self.response_timeout {
            return Err(RedisError::Config(format!(
                "the replica timeout ({:?}) must be shorter than the response timeout ({:?}), \
                 or every wait for replicas would time out as a lost connection",
                self.replica_timeout, self.response_timeout
            )));
        }
        crate::keys::check_namespace(&self.namespace)
    }

    /// The URL as [`lease_core::redact_url`] shows it.
    pub(crate) fn shown_url(&self) -> String {
        redact_url(&self.given)
    }
}

/// `h1:p1,h2:p2` as host and port pairs (port 6379 when absent; IPv6 hosts in brackets).
fn split_hosts(hosts: &str, shown: &str) -> Result<Vec<(String, u16)>, String> {
    let list: Vec<(String, u16)> = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| {
            let (host, port) = match h.rsplit_once(':') {
                Some((host, port)) if !port.contains(']') => (host, port),
                _ => (h, "6379"),
            };
            let port = port
                .parse()
                .map_err(|_| format!("{shown}: port {port:?} of {host:?} is not a port number"))?;
            Ok((
                host.trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_owned(),
                port,
            ))
        })
        .collect::<Result<_, String>>()?;
    if list.is_empty() {
        return Err(format!("{shown}: no host given"));
    }
    Ok(list)
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &self.shown_url())
            .field("namespace", &self.namespace)
            .field("volatile", &self.volatile)
            .field("wake_ups", &self.wake_ups)
            .field("async_replicas", &self.async_replicas)
            .field("fsync_asserted", &self.fsync_asserted)
            .field("replicas", &self.replicas)
            .field("replica_timeout", &self.replica_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("signal_key", &self.signal_key)
            .finish()
    }
}

impl fmt::Display for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (namespace {}", self.shown_url(), self.namespace)?;
        if self.replicas > 0 {
            write!(f, ", {} replica acknowledgements", self.replicas)?;
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_display_hide_the_password() {
        for url in [
            "redis://:s3cr%40t@localhost:6379/0",
            "redis://user:s3cr%40t@localhost:6379",
            "rediss://s3cr%40t@host?volatile=true",
            "redis://:s3cr/t@h:6379",
            "redis://:s3cr#t@h:6379",
            "redis+cluster://u:s3cret@h1:1,h2:2",
            "redis+sentinel://:s3cret@h1:1,h2:2/svc",
            "redis+unix:///tmp/r.sock?pass=s3cret",
        ] {
            let config = RedisConfig::from_url(url);
            for shown in [format!("{config:?}"), config.to_string()] {
                assert!(!shown.contains("s3cr"), "{shown}");
                assert!(shown.contains("******"), "{shown}");
            }
        }
    }

    #[test]
    fn the_leaking_urls_of_issue_14_are_redacted() {
        for (url, expected) in [
            (
                "redis+unix:///tmp/r.sock?pass=hunter2",
                "redis+unix:///tmp/r.sock?pass=******",
            ),
            ("redis://:hun/ter2@h:6379", "redis://:******@h:6379"),
            ("redis://:hun#ter2@h:6379", "redis://:******"),
            (
                "redis://h:6379?PASSWORD=hunter2",
                "redis://h:6379?PASSWORD=******",
            ),
            (
                "redis://h:6379?api_token=hunter2",
                "redis://h:6379?api_token=******",
            ),
        ] {
            let config = RedisConfig::from_url(url);
            assert_eq!(config.shown_url(), expected);
            let err = config
                .check()
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            for shown in [format!("{config:?}"), config.to_string(), err] {
                assert!(!shown.contains("hun"), "{shown}");
            }
        }
    }

    #[test]
    fn parameters_are_read_and_unknown_ones_refused() {
        let config = RedisConfig::from_url(
            "redis://h:1/2?volatile=true&protocol=resp3&replicas=2&replica_timeout_ms=300",
        );
        assert!(config.is_volatile());
        assert_eq!(config.replicas(), 2);
        assert_eq!(config.replica_timeout(), Duration::from_millis(300));
        assert!(
            matches!(config.topology(), Ok(Topology::Single { url }) if url == "redis://h:1/2?protocol=resp3")
        );
        assert!(!RedisConfig::from_url("redis://h").is_volatile());
        for (bad, named) in [
            ("redis://h?volatile=perhaps", "volatile"),
            ("redis://h?volatle=true", "volatle"),
            ("redis://h?password=x", "password"),
            ("redis://h?pass=x", "\"pass\""),
            ("redis://h?PASSWORD=x", "\"PASSWORD\""),
            ("redis://h?api_token=x", "\"api_token\""),
            ("redis://h?secret_key=x", "\"secret_key\""),
            ("redis://h?db=1", "\"db\""),
            ("redis+cluster://h:1,h:2?volatle=true", "\"volatle\""),
            ("redis+sentinel://h:1/s?replica=1", "\"replica\""),
            ("redis+unix:///tmp/r.sock?password=x", "\"password\""),
            ("redis://:a/b@h", "'/'"),
            ("redis://:a?b@h", "'@'"),
            ("redis://h?protocol=resp3&x=a@b", "'@'"),
            ("redis://:a#b@h", "'#'"),
            ("redis://h?replicas=-1", "replicas"),
            ("redis://h?replica_timeout_ms=0", "replica_timeout_ms"),
            ("redis+cluster://h:1/3", "database"),
            ("redis+sentinel://h:1", "service"),
            ("redis+cluster://h:x", "port"),
            ("mysql://h", "scheme"),
        ] {
            let err = RedisConfig::from_url(bad).check().unwrap_err().to_string();
            assert!(err.contains(named), "{bad}: {err}");
        }
        for socket in [
            "redis+unix:///tmp/r.sock?db=2&user=u&pass=p%40w",
            "unix:///tmp/a@b.sock?pass=x",
        ] {
            let config = RedisConfig::from_url(socket);
            assert!(config.check().is_ok(), "{socket}: {:?}", config.check());
        }
        assert!(
            matches!(RedisConfig::from_url("redis+unix:///tmp/r.sock?pass=x&replicas=1").topology(), Ok(Topology::Single { url }) if url == "redis+unix:///tmp/r.sock?pass=x")
        );
        assert!(RedisConfig::from_url("redis://h")
            .with_namespace("a{b")
            .check()
            .is_err());
    }

    /// A replica timeout under 1 ms used to be sent as `WAIT N 0`, which blocks forever; it is
    /// refused by name, as is any timeout over a day. `async_replicas` takes accept or refuse.
    #[test]
    fn timeouts_out_of_range_and_bad_async_replicas_are_refused_by_name() {
        for (config, named) in [
            (
                RedisConfig::from_url("redis://:pw1234@h?replicas=1")
                    .with_replica_timeout(Duration::from_micros(500)),
                "replica timeout",
            ),
            (
                RedisConfig::from_url("redis://:pw1234@h").with_response_timeout(Duration::MAX),
                "response timeout",
            ),
            (
                RedisConfig::from_url("redis://:pw1234@h").with_connect_timeout(Duration::ZERO),
                "connect timeout",
            ),
            (
                RedisConfig::from_url("redis://:pw1234@h?async_replicas=yes"),
                "async_replicas",
            ),
        ] {
            let err = lease_core::Error::from(config.check().unwrap_err());
            assert!(
                matches!(err, lease_core::Error::Misconfigured { .. }),
                "{err:?}"
            );
            let shown = err.to_string();
            assert!(shown.contains(named), "{shown}");
            assert!(!shown.contains("pw1234"), "{shown}");
        }
        let accepting = RedisConfig::from_url("redis://h?async_replicas=accept");
        assert!(accepting.check().is_ok() && accepting.accepts_async_replicas());
        assert!(!RedisConfig::from_url("redis://h").accepts_async_replicas());
    }

    #[test]
    fn cluster_and_sentinel_urls_list_their_nodes() {
        let config = RedisConfig::from_url("rediss+cluster://u:p%2Fw@a:1,[::1]:2,b?protocol=resp3");
        match config.topology() {
            Ok(Topology::Cluster { nodes, .. }) => assert_eq!(
                nodes,
                &[
                    "rediss://u:p%2Fw@a:1",
                    "rediss://u:p%2Fw@[::1]:2",
                    "rediss://u:p%2Fw@b:6379"
                ]
            ),
            _ => panic!("not a cluster"),
        }
        match RedisConfig::from_url("redis+sentinel://:pw@s1:26379,s2:26380/orders/3").topology() {
            Ok(Topology::Sentinel {
                sentinels,
                service,
                db,
                userinfo,
                tls,
                ..
            }) => {
                assert_eq!(
                    sentinels,
                    &[("s1".to_owned(), 26379), ("s2".to_owned(), 26380)]
                );
                assert_eq!(
                    (service.as_str(), *db, userinfo.as_deref(), *tls),
                    ("orders", 3, Some(":pw"), false)
                );
            }
            _ => panic!("not sentinel"),
        }
    }
}
