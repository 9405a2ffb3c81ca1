//! The adapter's detailed failures, folded into [`lease_core::Error`].

/// Tags every error this adapter returns.
pub(crate) const BACKEND: &str = "redis";

/// What went wrong talking to Redis. Messages never carry the password: driver messages are
/// scrubbed before they are kept.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RedisError {
    /// The server could not be reached, dropped the connection, did not answer in time, or
    /// answered "not now, or not here" (LOADING, BUSY, TRYAGAIN, CLUSTERDOWN, READONLY).
    #[error("redis is unavailable: {0}")]
    Unreachable(String),
    /// Fewer replicas than configured acknowledged a write in time.
    #[error(
        "only {acked} of {wanted} replicas acknowledged the write within {timeout_ms} ms; the \
         result is withheld (a lease is never handed out unreplicated), retry later"
    )]
    Replicas {
        acked: i64,
        wanted: u32,
        timeout_ms: u128,
    },
    /// The server answered with an error.
    #[error("redis refused a command: {0}")]
    Command(String),
    /// The server is set up so that an acknowledged claim can be lost, and volatile mode was
    /// not asked for. The message names the setting and the fix.
    #[error("{0}")]
    Unsafe(String),
    /// A script answered something this adapter does not understand.
    #[error("unexpected reply from the {script} script: {detail}")]
    Reply {
        script: &'static str,
        detail: String,
    },
    /// The configuration cannot be used.
    #[error("{0}")]
    Config(String),
}

impl RedisError {
    /// Classifies a driver error from a direct connection (one server, or the Sentinels'
    /// primary), scrubbing `secret` (the password) from its message: there a `MOVED` means
    /// the URL points at a Cluster node.
    pub(crate) fn from_driver(err: &redis::RedisError, secret: Option<&str>) -> RedisError {
        Self::classify(err, secret, false)
    }

    /// Classifies a driver error from a Cluster connection: there `MOVED` and `ASK` mean the
    /// slot is being moved or failed over (the driver refreshes its slot map), which a retry
    /// gets past. The command was not run by the node that answered.
    pub(crate) fn from_cluster(err: &redis::RedisError, secret: Option<&str>) -> RedisError {
        Self::classify(err, secret, true)
    }

    fn classify(err: &redis::RedisError, secret: Option<&str>, cluster: bool) -> RedisError {
        let message = scrub(&err.to_string(), secret);
        let redirected = matches!(
            err.kind(),
            redis::ErrorKind::Server(redis::ServerErrorKind::Moved | redis::ServerErrorKind::Ask)
        );
        if redirected && !cluster {
            return RedisError::Config(format!(
                "the server is a Redis Cluster node and this namespace's slot is served by \
                 another node ({message}): connect with a redis+cluster://host:port,… URL"
            ));
        }
        if redirected || is_transient(err) {
            RedisError::Unreachable(message)
        } else {
            RedisError::Command(message)
        }
    }

    /// Whether the connection that produced this error should be dropped and made anew
    /// (re-resolving the primary through Sentinel, and re-checking durability).
    pub(crate) fn needs_reconnect(err: &redis::RedisError) -> bool {
        err.is_io_error()
            || err.is_timeout()
            || err.is_connection_dropped()
            || err.is_connection_refusal()
            || err.is_unrecoverable_error()
            || matches!(err.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
            || matches!(
                err.kind(),
                redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
            )
    }
}

/// The server error codes that mean "not now, or not here": a retry, later or after a
/// reconnect, can succeed without anyone changing a setting.
///
/// - `BUSY`: another client's script is running; `LOADING`: the server is reading its data;
/// - `MASTERDOWN`, `READONLY`: a replica, or a primary that lost its primary role (failover);
/// - `OOM`: `maxmemory` reached under `noeviction` (the write was refused, nothing evicted);
/// - `NOREPLICAS`: `min-replicas-to-write` not met at the moment;
/// - `MISCONF`: the server cannot persist (disk full, a failed snapshot) and refuses writes
///   until it can;
/// - `TRYAGAIN`, `CLUSTERDOWN`: a Cluster moving slots or failing over.
const TRANSIENT_CODES: &[&str] = &[
    "BUSY",
    "LOADING",
    "MASTERDOWN",
    "READONLY",
    "OOM",
    "NOREPLICAS",
    "MISCONF",
    "TRYAGAIN",
    "CLUSTERDOWN",
];

fn is_transient(err: &redis::RedisError) -> bool {
    err.is_io_error()
        || err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.code().is_some_and(|code| TRANSIENT_CODES.contains(&code))
        // `-ERR max number of clients reached`: the server's connection limit, freed as
        // other clients disconnect.
        || err
            .detail()
            .is_some_and(|detail| detail.contains("max number of clients reached"))
        || matches!(
            err.kind(),
            redis::ErrorKind::Server(
                redis::ServerErrorKind::BusyLoading
                    | redis::ServerErrorKind::TryAgain
                    | redis::ServerErrorKind::ClusterDown
                    | redis::ServerErrorKind::MasterDown
                    | redis::ServerErrorKind::ReadOnly
            ) | redis::ErrorKind::ClusterConnectionNotFound
                // During a failover the Sentinels may know no primary for a moment.
                | redis::ErrorKind::MasterNameNotFoundBySentinel
                | redis::ErrorKind::NoValidReplicasFoundBySentinel
        )
}

/// `text` with every occurrence of `secret` replaced by `******`.
pub(crate) fn scrub(text: &str, secret: Option<&str>) -> String {
    match secret {
        Some(secret) if !secret.is_empty() => text.replace(secret, "******"),
        _ => text.to_owned(),
    }
}

impl From<RedisError> for lease_core::Error {
    fn from(err: RedisError) -> lease_core::Error {
        match err {
            RedisError::Unreachable(_) | RedisError::Replicas { .. } => {
                lease_core::Error::unavailable(BACKEND, err)
            }
            RedisError::Unsafe(_) | RedisError::Config(_) => {
                lease_core::Error::misconfigured(BACKEND, err)
            }
            _ => lease_core::Error::backend(BACKEND, err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The driver's error for a server's error reply `line` (without the leading `-`).
    fn server_error(line: &str) -> redis::RedisError {
        let value = redis::parse_redis_value(format!("-{line}\r\n").as_bytes())
            .expect("an error reply parses");
        value.extract_error().expect_err("an error reply")
    }

    #[test]
    fn each_server_error_says_whether_to_retry() {
        // (reply, retryable): what the server says, and whether a retry can help.
        let table = [
            (
                "OOM command not allowed when used memory > 'maxmemory'.",
                true,
            ),
            ("NOREPLICAS Not enough good replicas to write.", true),
            (
                "MISCONF Errors writing to the AOF file: No space left on device",
                true,
            ),
            ("ERR max number of clients reached", true),
            ("BUSY Redis is busy running a script.", true),
            ("LOADING Redis is loading the dataset in memory", true),
            (
                "READONLY You can't write against a read only replica.",
                true,
            ),
            ("MASTERDOWN Link with MASTER is down", true),
            (
                "TRYAGAIN Multiple keys request during rehashing of slot",
                true,
            ),
            ("CLUSTERDOWN The cluster is down", true),
            ("ERR unknown command 'FOO'", false),
            (
                "NOPERM this user has no permissions to run the 'eval' command",
                false,
            ),
            (
                "WRONGTYPE Operation against a key holding the wrong kind of value",
                false,
            ),
            ("ERR Error running script: malformed run record", false),
        ];
        for (reply, retryable) in table {
            let err = server_error(reply);
            for cluster in [false, true] {
                let ours = RedisError::classify(&err, None, cluster);
                let core = lease_core::Error::from(ours);
                assert_eq!(
                    core.is_retryable(),
                    retryable,
                    "{reply} (cluster: {cluster}) became {core:?}"
                );
                if retryable {
                    assert!(
                        matches!(
                            core,
                            lease_core::Error::Unavailable {
                                backend: "redis",
                                ..
                            }
                        ),
                        "{reply}: {core:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_redirection_is_a_url_mistake_on_a_plain_connection_and_a_retry_on_a_cluster() {
        for reply in ["MOVED 3999 127.0.0.1:6381", "ASK 3999 127.0.0.1:6381"] {
            let err = server_error(reply);
            let plain = lease_core::Error::from(RedisError::from_driver(&err, None));
            assert!(
                matches!(plain, lease_core::Error::Misconfigured { .. })
                    && plain.to_string().contains("redis+cluster://"),
                "{reply}: {plain}"
            );
            let cluster = lease_core::Error::from(RedisError::from_cluster(&err, None));
            assert!(cluster.is_retryable(), "{reply}: {cluster}");
        }
    }
}
