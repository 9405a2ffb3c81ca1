//! The connection to Redis, whatever the topology: one server, a Cluster, or the primary a set
//! of Sentinels names. Runs the durability guard and the restore check (`epoch.rs`) on every
//! new connection, and waits for replica acknowledgements on the connection that carried the
//! write, in the same pipeline.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{AsyncConnectionConfig, IntoConnectionInfo, Value};

use crate::call::{Ack, Call};

use crate::config::{Protocol, RedisConfig, Topology};
use crate::epoch::Epoch;
use crate::error::{scrub, RedisError};
use crate::guard::Guard;
use crate::wire::{eval, eval_acked, Conn};

/// How often a Cluster's durability settings are read again. redis-rs reconnects to Cluster
/// nodes by itself, without telling; a node restarted with unsafe settings is noticed within
/// this interval, or at the first call after any failure, which forces a re-check.
const CLUSTER_RECHECK: Duration = Duration::from_millis(500);

/// The "last checked" value that makes the next call re-check.
const FORCE_RECHECK: u64 = u64::MAX;

/// The most connections carrying acknowledged writes at once (`replicas > 0`). A `WAIT`
/// blocks its connection until the replicas answer, so each such write has a connection of
/// its own; a write finding all of them busy waits at most the response timeout.
pub(crate) const ACKED_CONNECTIONS: usize = 32;

/// The connection, shared by every clone of a store.
pub(crate) struct Link {
    kind: Kind,
    guard: Guard,
    /// The namespace's epoch, incremented on every new connection and every 30 s.
    epoch: Epoch,
    /// The password, only to scrub it from driver messages; never printed.
    secret: Option<String>,
    /// A key in the namespace's slot (its barrier): routes the Cluster guard's reads, and
    /// the barrier write before each `WAIT`, to the node that serves the namespace.
    home: String,
    /// Idle connections for acknowledged writes, and permits bounding how many exist.
    acked_idle: Mutex<Vec<Conn>>,
    acked_permits: tokio::sync::Semaphore,
    response_timeout: Duration,
}

#[allow(clippy::large_enum_variant)] // one per store, never moved after connect
enum Kind {
    /// One server, or the Sentinels' primary: a multiplexed connection made anew after a
    /// failure, so that a restarted or promoted server is checked before it is used.
    Direct {
        source: Source,
        config: AsyncConnectionConfig,
        current: Mutex<Option<(u64, MultiplexedConnection)>>,
        generation: AtomicU64,
        reconnecting: tokio::sync::Mutex<()>,
    },
    /// A Cluster: redis-rs follows the slot map and failovers, and never resends a command
    /// (its retries are off: a resent write could be applied twice, and a resent `WAIT`
    /// would confirm nothing).
    Cluster {
        client: ClusterClient,
        conn: ClusterConnection,
        /// The seed nodes' URLs: wake-ups subscribe on one of them.
        seeds: Vec<String>,
        /// When the guard last passed, in ms since `epoch`.
        checked_ms: AtomicU64,
        epoch: Instant,
        rechecking: tokio::sync::Mutex<()>,
    },
}

enum Source {
    Client(redis::Client),
    Sentinel(tokio::sync::Mutex<SentinelClient>),
}

impl Link {
    /// Connects as `config` says and runs the guard.
    pub(crate) async fn connect(
        config: &RedisConfig,
        guard: Guard,
        epoch: Epoch,
        home: String,
        client: Option<redis::Client>,
    ) -> Result<Link, RedisError> {
        let timeouts = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(config.connect_timeout()))
            .set_response_timeout(Some(config.response_timeout()));
        let shown = config.shown_url();
        let bad_url = |e: redis::RedisError, secret: Option<&str>| {
            RedisError::Config(format!(
                "cannot use {shown}: {}",
                scrub(&e.to_string(), secret)
            ))
        };
        let topology = config.topology()?;
        guard.check_topology(matches!(topology, Topology::Sentinel { .. }))?;
        let (kind, secret) = match topology {
            Topology::Single { url } => {
                let client = match client {
                    Some(client) => client,
                    None => redis::Client::open(url.as_str())
                        .map_err(|e| bad_url(e, Some(url.as_str())))?,
                };
                let secret = client
                    .get_connection_info()
                    .redis_settings()
                    .password()
                    .map(str::to_owned);
                (direct(Source::Client(client), timeouts), secret)
            }
            Topology::Sentinel {
                sentinels,
                service,
                tls,
                db,
                userinfo,
                protocol,
            } => {
                let (username, password) = credentials(userinfo.as_deref())
                    .map_err(|e| bad_url(e, userinfo.as_deref()))?;
                let addrs = sentinels
                    .iter()
                    .map(|(host, port)| redis::ConnectionAddr::Tcp(host.clone(), *port));
                let mut builder =
                    SentinelClientBuilder::new(addrs, service, SentinelServerType::Master)
                        .map_err(|e| bad_url(e, password.as_deref()))?
                        .set_client_to_redis_db(*db);
                if *tls {
                    builder = builder.set_client_to_redis_tls_mode(redis::TlsMode::Secure);
                }
                if let Some(username) = &username {
                    builder = builder.set_client_to_redis_username(username);
                }
                if let Some(password) = &password {
                    builder = builder.set_client_to_redis_password(password);
                }
                if let Some(protocol) = protocol {
                    builder = builder.set_client_to_redis_protocol(protocol_version(*protocol));
                }
                let client = builder
                    .build()
                    .map_err(|e| bad_url(e, password.as_deref()))?;
                (
                    direct(Source::Sentinel(tokio::sync::Mutex::new(client)), timeouts),
                    password,
                )
            }
            Topology::Cluster { nodes, protocol } => {
                let secret = nodes
                    .first()
                    .and_then(|n| n.as_str().into_connection_info().ok())
                    .and_then(|info| info.redis_settings().password().map(str::to_owned));
                let mut builder = redis::cluster::ClusterClientBuilder::new(nodes.clone())
                    .connection_timeout(config.connect_timeout())
                    .response_timeout(config.response_timeout())
                    // No resends: a write resent after a lost reply could apply twice, and a
                    // `WAIT` resent on a new connection would confirm nothing. A redirection
                    // or a lost connection is reported (retryable) and the slot map refreshed.
                    .retries(0);
                if let Some(protocol) = protocol {
                    builder = builder.use_protocol(protocol_version(*protocol));
                }
                let client = builder.build().map_err(|e| bad_url(e, secret.as_deref()))?;
                let conn = client
                    .get_async_connection()
                    .await
                    .map_err(|e| RedisError::from_cluster(&e, secret.as_deref()))?;
                let kind = Kind::Cluster {
                    client,
                    conn,
                    seeds: nodes.clone(),
                    checked_ms: AtomicU64::new(FORCE_RECHECK),
                    epoch: Instant::now(),
                    rechecking: tokio::sync::Mutex::new(()),
                };
                (kind, secret)
            }
        };
        let link = Link {
            kind,
            guard,
            epoch,
            secret,
            home,
            acked_idle: Mutex::new(Vec::new()),
            acked_permits: tokio::sync::Semaphore::new(ACKED_CONNECTIONS),
            response_timeout: config.response_timeout(),
        };
        // Connect now, so that an unreachable or unsafe server is reported by `connect`.
        drop(link.shared().await?);
        Ok(link)
    }

    /// A connection subscribed to `channel`, for wake-ups: on the server, on the primary the
    /// Sentinels name now, or on the `attempt`-th Cluster seed (a Cluster hands a `PUBLISH` to
    /// the subscribers of every node, so any node will do; the seeds are tried in turn).
    pub(crate) async fn subscribe(
        &self,
        channel: &str,
        attempt: usize,
    ) -> Result<redis::aio::PubSub, RedisError> {
        let driver = |e: redis::RedisError| RedisError::from_driver(&e, self.secret());
        let subscribed = async {
            let client = match &self.kind {
                Kind::Direct {
                    source: Source::Client(client),
                    ..
                } => client.clone(),
                Kind::Direct {
                    source: Source::Sentinel(sentinels),
                    ..
                } => sentinels
                    .lock()
                    .await
                    .async_get_client()
                    .await
                    .map_err(driver)?,
                Kind::Cluster { seeds, .. } => {
                    let seed = &seeds[attempt % seeds.len()];
                    redis::Client::open(seed.as_str()).map_err(driver)?
                }
            };
            let mut pubsub = client.get_async_pubsub().await.map_err(driver)?;
            pubsub.subscribe(channel).await.map_err(driver)?;
            Ok(pubsub)
        };
        tokio::time::timeout(self.response_timeout, subscribed)
            .await
            .map_err(|_| {
                RedisError::Unreachable(format!(
                    "no subscription within {:?}",
                    self.response_timeout
                ))
            })?
    }

    pub(crate) fn secret(&self) -> Option<&str> {
        self.secret.as_deref()
    }

    pub(crate) fn guard(&self) -> &Guard {
        &self.guard
    }

    pub(crate) fn epoch(&self) -> &Epoch {
        &self.epoch
    }

    /// Runs a script that writes nothing, or whose writes need no replica acknowledgement,
    /// on the shared connection (which never carries a `WAIT`, so a frozen replica never
    /// delays it).
    pub(crate) async fn read(&self, call: &Call<'_>) -> Result<Value, RedisError> {
        self.tick().await?;
        self.read_call(call).await
    }

    /// Runs one plain command that writes nothing on the shared connection, after the
    /// epoch's tick, as [`read`](Link::read) runs a script.
    pub(crate) async fn command(&self, cmd: &redis::Cmd) -> Result<Value, RedisError> {
        self.tick().await?;
        let (id, mut conn) = self.shared().await?;
        conn.query(cmd).await.map_err(|e| self.failed(&e, id))
    }

    async fn read_call(&self, call: &Call<'_>) -> Result<Value, RedisError> {
        let (id, mut conn) = self.shared().await?;
        eval(&mut conn, call, &self.home)
            .await
            .map_err(|e| self.failed(&e, id))
    }

    /// Runs a write. Without replicas to wait for, as [`read`](Link::read). With
    /// `replicas=N`, on a connection of its own, as one pipeline: the script, a write of the
    /// namespace's barrier, and `WAIT N timeout`. The replication stream is ordered, so once
    /// the replicas acknowledged the barrier they hold everything the script wrote **or
    /// saw**: a verdict such as "already ended under your fence" is confirmed like a fresh
    /// write. The three travel together, so no reconnect can come between the write and its
    /// `WAIT`; a connection lost on the way fails the call (retryable), and is not reused.
    pub(crate) async fn write(&self, call: &Call<'_>) -> Result<(Value, Ack), RedisError> {
        self.tick().await?;
        self.write_call(call).await
    }

    async fn write_call(&self, call: &Call<'_>) -> Result<(Value, Ack), RedisError> {
        let wanted = self.guard.replicas();
        if wanted == 0 {
            return Ok((self.read_call(call).await?, Ack::none()));
        }
        let timeout = self.guard.replica_timeout();
        let _permit = tokio::time::timeout(self.response_timeout, self.acked_permits.acquire())
            .await
            .map_err(|_| {
                RedisError::Unreachable(format!(
                    "all {ACKED_CONNECTIONS} connections for acknowledged writes stayed busy \
                     waiting for replicas for {:?}",
                    self.response_timeout
                ))
            })?
            .map_err(|_| RedisError::Unreachable("the store is closing".to_owned()))?;
        let idle = lock(&self.acked_idle).pop();
        let mut conn = match idle {
            Some(conn) => {
                // A Cluster's guard is re-read on its schedule whichever connection writes.
                if matches!(self.kind, Kind::Cluster { .. }) {
                    drop(self.shared().await?);
                }
                conn
            }
            None => self.acked_connection().await?,
        };
        let answer = eval_acked(
            &mut conn,
            call,
            &self.home,
            wanted,
            timeout.as_millis() as u64,
        )
        .await;
        match answer {
            Ok((value, acked)) => {
                lock(&self.acked_idle).push(conn);
                Ok((value, Ack::new(wanted, acked, timeout.as_millis())))
            }
            // The connection is dropped: whatever it was doing is not to be trusted again.
            Err(e) => Err(self.failed(&e, 0)),
        }
    }

    /// A new connection for acknowledged writes, checked by the guard like the shared one.
    async fn acked_connection(&self) -> Result<Conn, RedisError> {
        match &self.kind {
            Kind::Direct { source, config, .. } => {
                let conn = open(source, config)
                    .await
                    .map_err(|e| RedisError::from_driver(&e, self.secret()))?;
                let mut conn = Conn::Direct(conn);
                self.check_new(&mut conn).await?;
                Ok(conn)
            }
            Kind::Cluster { client, .. } => {
                // The guard reads the namespace's node through the shared connection, on
                // its schedule; this connection reaches the same nodes.
                drop(self.shared().await?);
                let conn = client
                    .get_async_connection()
                    .await
                    .map_err(|e| RedisError::from_cluster(&e, self.secret()))?;
                Ok(Conn::Cluster(conn))
            }
        }
    }

    /// The shared connection: the current one, or a new one that passed the guard (and on a
    /// Cluster, the guard re-read when it is due). The id names a direct connection, to drop
    /// it after a failure.
    async fn shared(&self) -> Result<(u64, Conn), RedisError> {
        match &self.kind {
            Kind::Direct {
                source,
                config,
                current,
                generation,
                reconnecting,
            } => {
                if let Some((id, conn)) = lock(current).clone() {
                    return Ok((id, Conn::Direct(conn)));
                }
                let _one_at_a_time = reconnecting.lock().await;
                if let Some((id, conn)) = lock(current).clone() {
                    return Ok((id, Conn::Direct(conn)));
                }
                let conn = open(source, config)
                    .await
                    .map_err(|e| RedisError::from_driver(&e, self.secret()))?;
                self.check_new(&mut Conn::Direct(conn.clone())).await?;
                let id = generation.fetch_add(1, Ordering::Relaxed) + 1;
                *lock(current) = Some((id, conn.clone()));
                if id > 1 {
                    tracing::info!(
                        "reconnected to redis; durability settings and the epoch checked again"
                    );
                }
                Ok((id, Conn::Direct(conn)))
            }
            Kind::Cluster {
                conn,
                checked_ms,
                epoch,
                rechecking,
                ..
            } => {
                let stale = |checked: u64| {
                    checked == FORCE_RECHECK
                        || elapsed_ms(*epoch).saturating_sub(checked)
                            > CLUSTER_RECHECK.as_millis() as u64
                };
                if stale(checked_ms.load(Ordering::Relaxed)) {
                    let _one_at_a_time = rechecking.lock().await;
                    let checked = checked_ms.load(Ordering::Relaxed);
                    if stale(checked) {
                        self.guard
                            .check_cluster(&mut conn.clone(), &self.home, self.secret())
                            .await?;
                        if checked == FORCE_RECHECK {
                            // After a failure redis-rs may have reconnected: the epoch as on
                            // a new connection, without a WAIT on the shared connection (an
                            // increment left unacknowledged is judged, not remembered).
                            self.check_epoch(&mut Conn::Cluster(conn.clone()), false)
                                .await?;
                        }
                        checked_ms.store(elapsed_ms(*epoch), Ordering::Relaxed);
                    }
                }
                Ok((0, Conn::Cluster(conn.clone())))
            }
        }
    }

    /// Checks a new direct connection before its first command: the durability guard, then
    /// the epoch (with a `WAIT` if replicas must acknowledge: nobody else uses the connection
    /// yet).
    async fn check_new(&self, conn: &mut Conn) -> Result<(), RedisError> {
        if let Conn::Direct(direct) = conn {
            self.guard.check_direct(direct, self.secret()).await?;
        }
        self.check_epoch(conn, true).await
    }

    /// Increments the namespace's epoch on `conn` and judges it (`epoch.rs`); with
    /// `may_wait` and replicas configured, in a pipeline with `WAIT`, so that only an
    /// acknowledged epoch is remembered.
    async fn check_epoch(&self, conn: &mut Conn, may_wait: bool) -> Result<(), RedisError> {
        let (call, sent) = self.epoch.call();
        let wanted = self.guard.replicas();
        let cluster = matches!(conn, Conn::Cluster(_));
        let fail = |e: redis::RedisError| {
            if cluster {
                RedisError::from_cluster(&e, self.secret())
            } else {
                RedisError::from_driver(&e, self.secret())
            }
        };
        if wanted > 0 && may_wait {
            let timeout = self.guard.replica_timeout().as_millis() as u64;
            let answer = eval_acked(conn, &call, &self.home, wanted, timeout).await;
            let (value, acked) = answer.map_err(fail)?;
            self.epoch.judge(value, acked >= i64::from(wanted), sent)
        } else {
            let value = eval(conn, &call, &self.home).await.map_err(fail)?;
            self.epoch.judge(value, wanted == 0, sent)
        }
    }

    /// The periodic increment of the epoch, when due (`epoch.rs`), before a call. A restore
    /// found drops the connections, so that every call checks again on a new one until the
    /// namespace is rebound.
    async fn tick(&self) -> Result<(), RedisError> {
        if !self.epoch.due() {
            return Ok(());
        }
        let (call, sent) = self.epoch.call();
        let judged = if self.guard.replicas() == 0 {
            let value = self.read_call(&call).await?;
            self.epoch.judge(value, true, sent)
        } else {
            let (value, ack) = self.write_call(&call).await?;
            self.epoch.judge(value, ack.confirm().is_ok(), sent)
        };
        if judged.is_err() {
            self.recheck();
        }
        judged
    }

    /// Makes the next call check a new connection first (a script found the namespace
    /// restored).
    pub(crate) fn recheck(&self) {
        lock(&self.acked_idle).clear();
        match &self.kind {
            Kind::Direct { current, .. } => *lock(current) = None,
            Kind::Cluster { checked_ms, .. } => checked_ms.store(FORCE_RECHECK, Ordering::Relaxed),
        }
    }

    /// Classifies a failure. One that calls for a new connection also drops the shared
    /// direct connection `id` (a newer one is kept) and the idle acknowledged-write
    /// connections, or makes a Cluster's next call re-read the guard first (a node may be
    /// coming back with other settings).
    fn failed(&self, e: &redis::RedisError, id: u64) -> RedisError {
        if RedisError::needs_reconnect(e) {
            lock(&self.acked_idle).clear();
            match &self.kind {
                Kind::Direct { current, .. } => {
                    let mut current = lock(current);
                    if id == 0 || current.as_ref().is_some_and(|(held, _)| *held == id) {
                        *current = None;
                    }
                }
                Kind::Cluster { checked_ms, .. } => {
                    checked_ms.store(FORCE_RECHECK, Ordering::Relaxed);
                }
            }
        }
        match &self.kind {
            Kind::Direct { .. } => RedisError::from_driver(e, self.secret()),
            Kind::Cluster { .. } => RedisError::from_cluster(e, self.secret()),
        }
    }
}

/// A new multiplexed connection to the server `source` names.
async fn open(
    source: &Source,
    config: &AsyncConnectionConfig,
) -> redis::RedisResult<MultiplexedConnection> {
    match source {
        Source::Client(client) => {
            client
                .get_multiplexed_async_connection_with_config(config)
                .await
        }
        Source::Sentinel(client) => {
            client
                .lock()
                .await
                .get_async_connection_with_config(config)
                .await
        }
    }
}

fn direct(source: Source, config: AsyncConnectionConfig) -> Kind {
    Kind::Direct {
        source,
        config,
        current: Mutex::new(None),
        generation: AtomicU64::new(0),
        reconnecting: tokio::sync::Mutex::new(()),
    }
}

/// The decoded user name and password of a URL's user info.
fn credentials(userinfo: Option<&str>) -> redis::RedisResult<(Option<String>, Option<String>)> {
    let Some(userinfo) = userinfo else {
        return Ok((None, None));
    };
    let info = format!("redis://{userinfo}@127.0.0.1:1").into_connection_info()?;
    let settings = info.redis_settings();
    Ok((
        settings.username().map(str::to_owned),
        settings.password().map(str::to_owned),
    ))
}

fn protocol_version(protocol: Protocol) -> redis::ProtocolVersion {
    match protocol {
        Protocol::Resp2 => redis::ProtocolVersion::RESP2,
        Protocol::Resp3 => redis::ProtocolVersion::RESP3,
    }
}

/// The guarded value, through a poisoned lock too (nothing guarded here is left half-written).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn elapsed_ms(epoch: Instant) -> u64 {
    epoch.elapsed().as_millis() as u64
}
