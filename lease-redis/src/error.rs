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
    /// Classifies a driver error, scrubbing `secret` (the password) from its message.
    pub(crate) fn from_driver(err: &redis::RedisError, secret: Option<&str>) -> RedisError {
        let message = scrub(&err.to_string(), secret);
        if matches!(
            err.kind(),
            redis::ErrorKind::Server(redis::ServerErrorKind::Moved | redis::ServerErrorKind::Ask)
        ) {
            return RedisError::Config(format!(
                "the server is a Redis Cluster node and this namespace's slot is served by \
                 another node ({message}): connect with a redis+cluster://host:port,… URL"
            ));
        }
        let transient = err.is_io_error()
            || err.is_timeout()
            || err.is_connection_dropped()
            || err.is_connection_refusal()
            || matches!(
                err.code(),
                Some("BUSY" | "MASTERDOWN" | "READONLY" | "LOADING")
            )
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
            );
        if transient {
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
