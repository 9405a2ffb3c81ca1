//! The durability guard: refuses a server on which an acknowledged claim can be lost, so that
//! a fence is never issued twice, unless the user accepted that risk (`volatile=true`).
//!
//! Read with one `CONFIG GET` at connect and on every new connection (after a reconnect, or a
//! Sentinel failover), and every half second on a Cluster, where only the master serving the
//! namespace's slot is read: a dead or unsafe master elsewhere stops only its own slots.

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
    /// Replicas of a plain master that acknowledge nothing are accepted (`async_replicas`).
    async_replicas: bool,
    /// The operator asserts the settings `CONFIG GET` cannot read (`fsync=asserted`).
    fsync_asserted: bool,
    /// Behind Sentinel: the topology check already refuses `replicas=0` there.
    sentinel: bool,
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
    /// Whether `async_replicas=accept` covers it (it covers nothing but attached replicas).
    narrow: bool,
    /// Whether it is that the settings cannot be read, which `fsync=asserted` covers (and
    /// nothing else).
    unreadable: bool,
}

impl Guard {
    pub(crate) fn new(config: &RedisConfig) -> Guard {
        Guard {
            volatile: config.is_volatile(),
            async_replicas: config.accepts_async_replicas(),
            fsync_asserted: config.asserts_fsync(),
            sentinel: matches!(
                config.topology(),
                Ok(crate::config::Topology::Sentinel { .. })
            ),
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

    /// The unsafe settings accepted so far (only ever non-empty in volatile mode or under
    /// `async_replicas=accept`).
    pub(crate) fn accepted(&self) -> Vec<String> {
        self.accepted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Checks the server behind a direct (single server or Sentinel) connection: its
    /// settings, and — without replica acknowledgements — that no replica is attached, which a
    /// failover could promote without the last claims (Sentinel is refused before, from the
    /// URL alone).
    pub(crate) async fn check_direct(
        &self,
        conn: &mut MultiplexedConnection,
        secret: Option<&str>,
    ) -> Result<(), RedisError> {
        let reply: redis::RedisResult<Value> = query().query_async(conn).await;
        let mut risks = self.judge(&self.server, reply, true, secret)?;
        if self.replicas == 0 && !self.sentinel {
            let mut info = redis::cmd("INFO");
            info.arg("replication");
            let reply: redis::RedisResult<Value> = info.query_async(conn).await;
            let attached = match reply {
                Ok(Value::BulkString(b)) => connected_replicas(&String::from_utf8_lossy(&b)),
                Ok(Value::VerbatimString { text, .. }) => connected_replicas(&text),
                Ok(_) => 0,
                Err(e) => match RedisError::from_driver(&e, secret) {
                    // INFO renamed or not permitted: the replicas cannot be counted.
                    RedisError::Command(_) => usize::MAX,
                    other => return Err(other),
                },
            };
            if attached > 0 {
                let count = if attached == usize::MAX {
                    "an unknown number of replicas (INFO replication is not permitted)".to_owned()
                } else {
                    format!("{attached} replica(s)")
                };
                risks.push(Risk {
                    setting: "replicas without replicas=N".to_owned(),
                    sentence: format!(
                        "redis at {} has {count} attached (connected_slaves) and replicas=0, so \
                         a claim is acknowledged before any replica has it: a replica promoted \
                         after a failure would issue its fence again; add ?replicas=N (N \
                         replicas acknowledge every lease and write), or, for read replicas \
                         that are never promoted while this store runs, accept exactly this \
                         risk with ?async_replicas=accept",
                        self.server
                    ),
                    narrow: true,
                    unreadable: false,
                });
            }
        }
        self.settle(risks)
    }

    /// The risks of the topology itself, known from the URL: a Sentinel-managed primary is
    /// there to be failed over, and a promoted replica misses every claim it had not
    /// received unless replicas acknowledge each one.
    pub(crate) fn check_topology(&self, sentinel: bool) -> Result<(), RedisError> {
        if !sentinel || self.replicas > 0 {
            return Ok(());
        }
        self.settle(vec![Risk {
            setting: "replicas=0 behind Sentinel".to_owned(),
            sentence: format!(
                "{} is a Sentinel-managed primary, which Sentinel fails over to a replica, and \
                 with replicas=0 a claim is acknowledged before any replica has it: the promoted \
                 replica would issue its fence again; add ?replicas=N (N replicas acknowledge \
                 every lease and write), or accept the risk with ?volatile=true",
                self.server
            ),
            narrow: false,
            unreadable: false,
        }])
    }

    /// Checks the Cluster master that serves `key`'s slot (the namespace's one shard), and
    /// whether the cluster has replicas that a failover could promote.
    pub(crate) async fn check_cluster(
        &self,
        conn: &mut ClusterConnection,
        key: &str,
        secret: Option<&str>,
    ) -> Result<(), RedisError> {
        let fail = |e: redis::RedisError| RedisError::from_cluster(&e, secret);
        let reply = crate::wire::on_home_node(conn, query(), key).await;
        let node = format!("the node serving {key}");
        let reply = match reply {
            Ok(Value::ServerError(e)) => Err(redis::RedisError::from(e)),
            other => other,
        };
        let mut risks = self.judge(&node, reply, false, secret)?;
        if self.replicas == 0 {
            let mut nodes = redis::cmd("CLUSTER");
            nodes.arg("NODES");
            let listing = crate::wire::on_home_node(conn, nodes, key)
                .await
                .map_err(fail)?;
            let listing = match listing {
                Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
                Value::VerbatimString { text, .. } => text,
                Value::SimpleString(s) => s,
                other => {
                    return Err(RedisError::Reply {
                        script: "CLUSTER NODES",
                        detail: format!("expected the node table, got {other:?}"),
                    })
                }
            };
            // The master's own count covers a replica attached a moment ago, before gossip
            // has told the node table what it is.
            let mut info = redis::cmd("INFO");
            info.arg("replication");
            let attached = match crate::wire::on_home_node(conn, info, key)
                .await
                .map_err(fail)?
            {
                Value::BulkString(b) => connected_replicas(&String::from_utf8_lossy(&b)),
                Value::VerbatimString { text, .. } => connected_replicas(&text),
                _ => 0,
            };
            let replicas = cluster_replicas(&listing).max(attached);
            if replicas > 0 {
                risks.push(Risk {
                    setting: "replicas=0 on a Cluster with replicas".to_owned(),
                    sentence: format!(
                        "the Redis Cluster at {} has {replicas} replica node(s), which it \
                         promotes when a master fails, and with replicas=0 a claim is \
                         acknowledged before any replica has it: the promoted replica would \
                         issue its fence again; add ?replicas=N (N replicas acknowledge every \
                         lease and write), or accept the risk with ?volatile=true",
                        self.server
                    ),
                    narrow: false,
                    unreadable: false,
                });
            }
        }
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
                     lose acknowledged claims: allow CONFIG GET for this user (ACL +config|get); \
                     or, on a managed server that runs with appendonly yes, appendfsync always \
                     and maxmemory-policy noeviction, assert exactly that with ?fsync=asserted; \
                     or accept every risk with ?volatile=true"
                ),
                narrow: false,
                unreadable: true,
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
                narrow: false,
                unreadable: false,
            });
        } else {
            // Replicas do not waive this: a primary that restarts faster than a failover is
            // declared comes back without its unsynced tail, and its replicas resync from it.
            let value = get("appendfsync");
            if value != "always" {
                risks.push(Risk {
                    setting: format!("appendfsync {value}"),
                    sentence: format!(
                        "redis at {node} syncs its append-only file to disk {value:?}, not \
                         always: an OS crash or power loss can drop the last acknowledged claims \
                         and their fences would be issued again (replicas do not cover it: a \
                         primary that restarts before a failover comes back without them and its \
                         replicas resync from it); set appendfsync always, or accept the risk \
                         with ?volatile=true"
                    ),
                    narrow: false,
                    unreadable: false,
                });
            }
            if get("no-appendfsync-on-rewrite") == "yes" {
                risks.push(Risk {
                    setting: "no-appendfsync-on-rewrite yes".to_owned(),
                    sentence: format!(
                        "redis at {node} skips fsync while it rewrites its append-only file \
                         (no-appendfsync-on-rewrite yes), so claims acknowledged during a \
                         rewrite can be lost in an OS crash and their fences issued again; set \
                         no-appendfsync-on-rewrite no, or accept the risk with ?volatile=true"
                    ),
                    narrow: false,
                    unreadable: false,
                });
            }
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
                narrow: false,
                unreadable: false,
            });
        }
        Ok(risks)
    }

    /// Refuses every risk not accepted (by `volatile`, or the narrow `async_replicas`);
    /// records the accepted ones and warns once.
    fn settle(&self, risks: Vec<Risk>) -> Result<(), RedisError> {
        if risks.is_empty() {
            return Ok(());
        }
        let (taken, refused): (Vec<Risk>, Vec<Risk>) = risks.into_iter().partition(|r| {
            self.volatile
                || (r.narrow && self.async_replicas)
                || (r.unreadable && self.fsync_asserted)
        });
        if !refused.is_empty() {
            let sentences: Vec<String> = refused.into_iter().map(|r| r.sentence).collect();
            return Err(RedisError::Unsafe(sentences.join("; also, ")));
        }
        let mut accepted = self
            .accepted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for risk in taken {
            let setting = if risk.unreadable && self.fsync_asserted && !self.volatile {
                format!(
                    "{} (fsync=asserted: appendfsync always and noeviction taken on trust)",
                    risk.setting
                )
            } else {
                risk.setting
            };
            if !accepted.contains(&setting) {
                accepted.push(setting);
            }
        }
        if !self.warned.swap(true, Ordering::Relaxed) {
            if self.volatile {
                tracing::warn!(
                    server = %self.server,
                    accepted = %accepted.join(", "),
                    "volatile mode: accepting redis settings under which an acknowledged claim \
                     can be lost, so a fence may be issued twice after a crash, an eviction or \
                     a failover"
                );
            } else if accepted.iter().any(|a| a.contains("fsync=asserted")) {
                tracing::warn!(
                    server = %self.server,
                    accepted = %accepted.join(", "),
                    "fsync=asserted: the server's CONFIG cannot be read, and the operator \
                     asserts appendonly yes, appendfsync always and maxmemory-policy \
                     noeviction, which this store takes on trust: if the server does not run \
                     so, a fence may be issued twice after a crash or an eviction"
                );
            } else {
                tracing::warn!(
                    server = %self.server,
                    accepted = %accepted.join(", "),
                    "async_replicas=accept: accepting replicas that acknowledge nothing, so a \
                     fence may be issued twice if one of them is promoted"
                );
            }
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
        .arg("no-appendfsync-on-rewrite")
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

/// How many nodes of a `CLUSTER NODES` listing are replicas (flag `slave`), failed or not:
/// each is a node the cluster may promote.
fn cluster_replicas(listing: &str) -> usize {
    listing
        .lines()
        .filter(|line| {
            line.split_whitespace()
                .nth(2)
                .is_some_and(|flags| flags.split(',').any(|f| f == "slave" || f == "replica"))
        })
        .count()
}

/// `connected_slaves` of an `INFO replication` reply (0 when absent).
fn connected_replicas(info: &str) -> usize {
    info.lines()
        .find_map(|line| line.trim().strip_prefix("connected_slaves:"))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::{cluster_replicas, connected_replicas};

    #[test]
    fn attached_replicas_are_read_from_info() {
        assert_eq!(
            connected_replicas("# Replication\r\nrole:master\r\nconnected_slaves:2\r\n"),
            2
        );
        assert_eq!(connected_replicas("# Replication\r\nrole:master\r\n"), 0);
    }

    #[test]
    fn replicas_are_counted_from_the_node_table() {
        let masters_only = "\
07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004 myself,master - 0 0 4 connected 0-5460
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5461-10922
";
        assert_eq!(cluster_replicas(masters_only), 0);
        let with_replicas = format!(
            "{masters_only}\
292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 127.0.0.1:30003@31003 slave 07c37dfeb235213a872192d90877d0cd55635b91 0 1426238317741 4 connected
824fe116063bc5fcf9f4ffd895bc17aee7731ac3 127.0.0.1:30006@31006 slave,fail 67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 0 1426238316232 2 disconnected
"
        );
        assert_eq!(cluster_replicas(&with_replicas), 2);
    }
}
