//! The connection to Redis, whatever the topology: one server, a Cluster, or the primary a set
//! of Sentinels names. Runs the durability guard on every new connection, and waits for
//! replica acknowledgements on the connection that carried the write.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{AsyncConnectionConfig, Cmd, IntoConnectionInfo, ScriptInvocation, Value};

use crate::config::{Protocol, RedisConfig, Topology};
use crate::error::{scrub, RedisError};
use crate::guard::Guard;

/// How often a Cluster's durability settings are read again. redis-rs reconnects to Cluster
/// nodes by itself, without telling; a node restarted with unsafe settings is noticed within
/// this interval, or at the first call after any failure, which forces a re-check.
const CLUSTER_RECHECK: Duration = Duration::from_millis(500);

/// The "last checked" value that makes the next call re-check.
const FORCE_RECHECK: u64 = u64::MAX;

/// The connection, shared by every clone of a store.
pub(crate) struct Link {
    kind: Kind,
    guard: Guard,
    /// The password, only to scrub it from driver messages; never printed.
    secret: Option<String>,
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
    /// A Cluster: redis-rs follows the slot map, redirections and failovers.
    Cluster {
        conn: ClusterConnection,
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

/// The connection one operation uses for its script and, when replicas must acknowledge, for
/// the `WAIT` after it: `WAIT` counts the writes of the connection it is sent on.
pub(crate) struct Session<'a> {
    link: &'a Link,
    conn: Conn,
}

enum Conn {
    Direct(u64, MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Link {
    /// Connects as `config` says and runs the guard.
    pub(crate) async fn connect(config: &RedisConfig, guard: Guard) -> Result<Link, RedisError> {
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
        let (kind, secret) = match config.topology()? {
            Topology::Single { url } => {
                let client = redis::Client::open(url.as_str())
                    .map_err(|e| bad_url(e, Some(url.as_str())))?;
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
                    .retries(2)
                    .max_retry_wait(500);
                if let Some(protocol) = protocol {
                    builder = builder.use_protocol(protocol_version(*protocol));
                }
                let client = builder.build().map_err(|e| bad_url(e, secret.as_deref()))?;
                let conn = client
                    .get_async_connection()
                    .await
                    .map_err(|e| RedisError::from_driver(&e, secret.as_deref()))?;
                let kind = Kind::Cluster {
                    conn,
                    checked_ms: AtomicU64::new(0),
                    epoch: Instant::now(),
                    rechecking: tokio::sync::Mutex::new(()),
                };
                (kind, secret)
            }
        };
        let link = Link {
            kind,
            guard,
            secret,
        };
        // Connect now, so that an unreachable or unsafe server is reported by `connect`.
        match &link.kind {
            Kind::Direct { .. } => drop(link.session().await?),
            Kind::Cluster {
                conn,
                checked_ms,
                epoch,
                ..
            } => {
                link.guard
                    .check_cluster(&mut conn.clone(), link.secret())
                    .await?;
                checked_ms.store(elapsed_ms(*epoch), Ordering::Relaxed);
            }
        }
        Ok(link)
    }

    pub(crate) fn secret(&self) -> Option<&str> {
        self.secret.as_deref()
    }

    pub(crate) fn guard(&self) -> &Guard {
        &self.guard
    }

    /// A connection for one operation: the current one, or a new one that passed the guard.
    pub(crate) async fn session(&self) -> Result<Session<'_>, RedisError> {
        match &self.kind {
            Kind::Direct {
                source,
                config,
                current,
                generation,
                reconnecting,
            } => {
                if let Some((id, conn)) = lock(current).clone() {
                    return Ok(Session {
                        link: self,
                        conn: Conn::Direct(id, conn),
                    });
                }
                let _one_at_a_time = reconnecting.lock().await;
                if let Some((id, conn)) = lock(current).clone() {
                    return Ok(Session {
                        link: self,
                        conn: Conn::Direct(id, conn),
                    });
                }
                let mut conn = match source {
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
                .map_err(|e| RedisError::from_driver(&e, self.secret()))?;
                self.guard.check_direct(&mut conn, self.secret()).await?;
                let id = generation.fetch_add(1, Ordering::Relaxed) + 1;
                *lock(current) = Some((id, conn.clone()));
                if id > 1 {
                    tracing::info!("reconnected to redis; durability settings checked again");
                }
                Ok(Session {
                    link: self,
                    conn: Conn::Direct(id, conn),
                })
            }
            Kind::Cluster {
                conn,
                checked_ms,
                epoch,
                rechecking,
            } => {
                let stale = |checked: u64| {
                    checked == FORCE_RECHECK
                        || elapsed_ms(*epoch).saturating_sub(checked)
                            > CLUSTER_RECHECK.as_millis() as u64
                };
                if stale(checked_ms.load(Ordering::Relaxed)) {
                    let _one_at_a_time = rechecking.lock().await;
                    if stale(checked_ms.load(Ordering::Relaxed)) {
                        self.guard
                            .check_cluster(&mut conn.clone(), self.secret())
                            .await?;
                        checked_ms.store(elapsed_ms(*epoch), Ordering::Relaxed);
                    }
                }
                Ok(Session {
                    link: self,
                    conn: Conn::Cluster(conn.clone()),
                })
            }
        }
    }

    /// Makes the next call on a Cluster re-read every primary's durability settings first.
    fn force_recheck(&self) {
        if let Kind::Cluster { checked_ms, .. } = &self.kind {
            checked_ms.store(FORCE_RECHECK, Ordering::Relaxed);
        }
    }

    /// Forgets the direct connection `id` after it failed, so the next operation makes a new
    /// one (and checks it). A newer connection is kept.
    fn drop_connection(&self, id: u64) {
        if let Kind::Direct { current, .. } = &self.kind {
            let mut current = lock(current);
            if current.as_ref().is_some_and(|(held, _)| *held == id) {
                *current = None;
            }
        }
    }
}

impl Session<'_> {
    /// Runs a script (EVALSHA, loading it on NOSCRIPT).
    pub(crate) async fn invoke(
        &mut self,
        call: &ScriptInvocation<'_>,
    ) -> Result<Value, RedisError> {
        let result = match &mut self.conn {
            Conn::Direct(_, conn) => call.invoke_async(conn).await,
            Conn::Cluster(conn) => call.invoke_async(conn).await,
        };
        result.map_err(|e| self.failed(&e))
    }

    /// Runs one command on this session's connection (routed like `key` on a Cluster).
    pub(crate) async fn command(&mut self, cmd: Cmd, key: &str) -> Result<Value, RedisError> {
        let result = match &mut self.conn {
            Conn::Direct(_, conn) => cmd.query_async(conn).await,
            Conn::Cluster(conn) => {
                let route = Route::with_key(key, SlotAddr::Master);
                conn.route_command(
                    cmd,
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                )
                .await
            }
        };
        result.map_err(|e| self.failed(&e))
    }

    /// Waits until the configured number of replicas acknowledged every write this
    /// connection sent so far (`WAIT`), or fails with [`RedisError::Replicas`].
    pub(crate) async fn replicated(&mut self, key: &str) -> Result<(), RedisError> {
        let wanted = self.link.guard.replicas();
        if wanted == 0 {
            return Ok(());
        }
        let timeout = self.link.guard.replica_timeout();
        let mut wait = redis::cmd("WAIT");
        wait.arg(wanted).arg(timeout.as_millis() as u64);
        let acked = match self.command(wait, key).await? {
            Value::Int(n) => n,
            other => {
                return Err(RedisError::Reply {
                    script: "WAIT",
                    detail: format!("expected a count of replicas, got {other:?}"),
                })
            }
        };
        if acked >= i64::from(wanted) {
            Ok(())
        } else {
            Err(RedisError::Replicas {
                acked,
                wanted,
                timeout_ms: timeout.as_millis(),
            })
        }
    }

    fn failed(&self, e: &redis::RedisError) -> RedisError {
        if RedisError::needs_reconnect(e) {
            match &self.conn {
                Conn::Direct(id, _) => self.link.drop_connection(*id),
                // A node may be coming back with other settings: check before the next call.
                Conn::Cluster(_) => self.link.force_recheck(),
            }
        }
        RedisError::from_driver(e, self.link.secret())
    }
}

/// Runs `CONFIG GET` on every primary of a Cluster: one reply per node.
pub(crate) async fn config_get_all(
    conn: &mut ClusterConnection,
    cmd: Cmd,
) -> redis::RedisResult<Vec<(String, Value)>> {
    let reply = conn
        .route_command(
            cmd,
            RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
        )
        .await?;
    Ok(match reply {
        Value::Map(pairs) => pairs
            .into_iter()
            .map(|(node, value)| {
                let node = match node {
                    Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
                    Value::SimpleString(s) => s,
                    other => format!("{other:?}"),
                };
                (node, value)
            })
            .collect(),
        single => vec![("cluster".to_owned(), single)],
    })
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

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn elapsed_ms(epoch: Instant) -> u64 {
    epoch.elapsed().as_millis() as u64
}
