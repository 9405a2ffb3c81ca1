//! The adapter's detailed failures, folded into [`lease_core::Error`].

/// Tags every error this adapter returns.
pub(crate) const BACKEND: &str = "redis";

/// What went wrong talking to Redis. Messages never carry the password: driver messages are
/// scrubbed before they are kept.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RedisError {
    /// The server could not be reached, dropped the connection, or did not answer in time.
    #[error("cannot reach redis: {0}")]
    Unreachable(String),
    /// The server answered with an error.
    #[error("redis refused a command: {0}")]
    Command(String),
    /// The server does not persist writes and volatile mode was not asked for.
    #[error(
        "redis at {server} does not persist writes (CONFIG GET appendonly is \"no\"): after a \
         restart every fence would reset to 0 and a new claim would reissue a fence an old \
         holder still carries, so two holders could share a fence. Enable AOF \
         (appendonly yes) or opt in to this risk with ?volatile=true in the URL"
    )]
    NotDurable {
        /// The server, password redacted.
        server: String,
    },
    /// A script answered something this adapter does not understand.
    #[error("unexpected reply from the {script} script: {detail}")]
    Reply {
        script: &'static str,
        detail: String,
    },
    /// The configuration cannot be used.
    #[error("invalid redis configuration: {0}")]
    Config(String),
}

impl RedisError {
    /// Classifies a driver error, scrubbing `secret` (the password) from its message.
    pub(crate) fn from_driver(err: &redis::RedisError, secret: Option<&str>) -> RedisError {
        let message = scrub(&err.to_string(), secret);
        let transient = err.is_io_error()
            || err.is_timeout()
            || err.is_connection_dropped()
            || err.is_connection_refusal()
            || matches!(
                err.kind(),
                redis::ErrorKind::Server(
                    redis::ServerErrorKind::BusyLoading
                        | redis::ServerErrorKind::TryAgain
                        | redis::ServerErrorKind::ClusterDown
                        | redis::ServerErrorKind::MasterDown
                        | redis::ServerErrorKind::Moved
                        | redis::ServerErrorKind::Ask
                ) | redis::ErrorKind::ClusterConnectionNotFound
            );
        if transient {
            RedisError::Unreachable(message)
        } else {
            RedisError::Command(message)
        }
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
            RedisError::Unreachable(_) => lease_core::Error::unavailable(BACKEND, err),
            _ => lease_core::Error::backend(BACKEND, err),
        }
    }
}
