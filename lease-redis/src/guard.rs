//! The durability guard: refuses a server on which an acknowledged claim can be lost, so that
//! a fence is never issued twice, unless the user accepted that risk (`volatile=true`).
//!
//! Read with one `CONFIG GET` at connect and on every new connection (after a reconnect, or a
//! Sentinel failover), and every few seconds on a Cluster.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::Value;

use crate::config::RedisConfig;
use crate::error::RedisError;

/// What the guard requires and what it has accepted.
pub(crate) struct Guard {
    volatile: bool,
    replicas: u32,
    replica_timeout: Duration,
    server: String,
    /// The unsafe settings accepted under `volatile`, for `Display` and the one warning.
    accepted: Mutex<Vec<String>>,
    warned: AtomicBool,
}

/// One setting that lets an acknowledged claim be lost.
struct Risk {
    /// Short, for `Display`: `appendfsync everysec`.
    setting: String,
    /// The sentence a refusal says.
    sentence: String,
}

impl Guard {
    pub(crate) fn new(config: &RedisConfig) -> Guard {
        Guard {
            volatile: config.is_volatile(),
            replicas: config.replicas(),
            replica_timeout: config.replica_timeout(),
            server: config.shown_url(),
            accepted: Mutex::new(Vec::new()),
            warned: AtomicBool::new(false),
        }
    }

    pub(crate) fn replicas(&self) -> u32 {
        self.replicas
    }

    pub(crate) fn replica_timeout(&self) -> Duration {
        self.replica_timeout
    }

    /// The unsafe settings accepted so far (only ever non-empty in volatile mode).
    pub(crate) fn accepted(&self) -> Vec<String> {
        self.accepted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Checks the server behind a direct (single server or Sentinel) connection.
    pub(crate) async fn check_direct(
        &self,
        conn: &mut MultiplexedConnection,
        secret: Option<&str>,
    ) -> Result<(), RedisError> {
        let reply: redis::RedisResult<Value> = query().query_async(conn).await;
        let risks = self.judge(&self.server, reply, true, secret)?;
        self.settle(risks)
    }

    /// Checks every primary of a Cluster.
    pub(crate) async fn check_cluster(
        &self,
        conn: &mut ClusterConnection,
        secret: Option<&str>,
    ) -> Result<(), RedisError> {
        let risks = match crate::link::config_get_all(conn, query()).await {
            Ok(replies) => {
                let mut risks = Vec::new();
                for (node, reply) in replies {
                    let reply = match reply {
                        Value::ServerError(e) => Err(redis::RedisError::from(e)),
                        value => Ok(value),
                    };
                    risks.extend(self.judge(&node, reply, false, secret)?);
                }
                risks
            }
            Err(e) => self.judge(&self.server, Err(e), false, secret)?,
        };
        self.settle(risks)
    }

    /// The risks one node's `CONFIG GET` reply shows; an error for a failure that is not
    /// about durability (unreachable, a Cluster node behind a plain URL).
    fn judge(
        &self,
        node: &str,
        reply: redis::RedisResult<Value>,
        direct: bool,
        secret: Option<&str>,
    ) -> Result<Vec<Risk>, RedisError> {
        let settings = match reply {
            Ok(value) => settings(value),
            // A refusal (unknown or renamed command, NOPERM) means the settings cannot be read;
            // a failure to reach the server is reported as such.
            Err(e) => match RedisError::from_driver(&e, secret) {
                RedisError::Command(_) => None,
                other => return Err(other),
            },
        };
        let Some(settings) = settings else {
            return Ok(vec![Risk {
                setting: "CONFIG unreadable".to_owned(),
                sentence: format!(
                    "cannot read the durability settings of redis at {node} (CONFIG GET is not \
                     permitted or renamed), and a server whose settings cannot be checked may \
                     lose acknowledged claims: allow CONFIG GET for this user (ACL +config|get) \
                     or accept the risk with ?volatile=true"
                ),
            }]);
        };
        let get = |name: &str| settings.get(name).map(String::as_str).unwrap_or("");
        if direct && get("cluster-enabled") == "yes" {
            return Err(RedisError::Config(format!(
                "redis at {node} is a Redis Cluster node: connect with a \
                 redis+cluster://host:port,… URL so that each namespace reaches the node that \
                 serves its slot"
            )));
        }
        let mut risks = Vec::new();
        if get("appendonly") != "yes" {
            risks.push(Risk {
                setting: "appendonly no".to_owned(),
                sentence: format!(
                    "redis at {node} does not persist writes (appendonly no): after a restart \
                     every fence would start again from 0 and a new claim would issue a fence an \
                     old holder still carries; set appendonly yes with appendfsync always, or \
                     accept the risk with ?volatile=true"
                ),
            });
        } else if get("appendfsync") != "always" && self.replicas == 0 {
            let value = get("appendfsync");
            risks.push(Risk {
                setting: format!("appendfsync {value}"),
                sentence: format!(
                    "redis at {node} syncs its append-only file to disk {value:?}, not always: \
                     an OS crash or power loss can drop the last acknowledged claims and their \
                     fences would be issued again; set appendfsync always, require replica \
                     acknowledgement with ?replicas=N, or accept the risk with ?volatile=true"
                ),
            });
        }
        let policy = get("maxmemory-policy");
        if policy.starts_with("allkeys-") {
            risks.push(Risk {
                setting: format!("maxmemory-policy {policy}"),
                sentence: format!(
                    "redis at {node} may evict any key (maxmemory-policy {policy}): an evicted \
                     run would come back at fence 0 and a fence would be issued twice; use \
                     maxmemory-policy noeviction (or a volatile-* policy: this adapter sets no \
                     expiry on its keys), or accept the risk with ?volatile=true"
                ),
            });
        }
        Ok(risks)
    }

    /// Refuses on the first risk unless volatile; in volatile mode records and warns once.
    fn settle(&self, risks: Vec<Risk>) -> Result<(), RedisError> {
        if risks.is_empty() {
            return Ok(());
        }
        if !self.volatile {
            let sentences: Vec<String> = risks.into_iter().map(|r| r.sentence).collect();
            return Err(RedisError::Unsafe(sentences.join("; also, ")));
        }
        let mut accepted = self
            .accepted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for risk in risks {
            if !accepted.contains(&risk.setting) {
                accepted.push(risk.setting);
            }
        }
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                server = %self.server,
                accepted = %accepted.join(", "),
                "volatile mode: accepting redis settings under which an acknowledged claim can \
                 be lost, so a fence may be issued twice after a crash, an eviction or a failover"
            );
        }
        Ok(())
    }
}

fn query() -> redis::Cmd {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET")
        .arg("appendonly")
        .arg("appendfsync")
        .arg("maxmemory-policy")
        .arg("cluster-enabled");
    cmd
}

/// A `CONFIG GET` reply (a flat list of pairs in RESP2, a map in RESP3) as a map; `None`
/// when it is neither.
fn settings(value: Value) -> Option<HashMap<String, String>> {
    let text = |v: Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(&b).into_owned()),
        Value::SimpleString(s) => Some(s),
        _ => None,
    };
    let pairs: Vec<(Value, Value)> = match value {
        Value::Map(pairs) => pairs,
        Value::Array(items) => {
            let mut items = items.into_iter();
            let mut pairs = Vec::new();
            while let (Some(k), Some(v)) = (items.next(), items.next()) {
                pairs.push((k, v));
            }
            pairs
        }
        _ => return None,
    };
    let map: HashMap<String, String> = pairs
        .into_iter()
        .filter_map(|(k, v)| Some((text(k)?, text(v)?)))
        .collect();
    // An empty answer means CONFIG GET was answered by something that is not Redis's CONFIG
    // (or every parameter was unknown): treat it as unreadable.
    (!map.is_empty()).then_some(map)
}
