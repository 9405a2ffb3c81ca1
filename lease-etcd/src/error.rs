//! etcd's failures, folded into [`lease_core::Error`].

use lease_core::Error;

use crate::rpc;

/// Tags every error this adapter returns.
pub(crate) const BACKEND: &str = "etcd";

/// Classifies a client error. Retryable: the cluster or a member unreachable, no leader, a
/// request that timed out or was cut by a leader change. Misconfigured: authentication and
/// permission failures (the message is the server's and never holds the password). Anything
/// else is a backend failure.
pub(crate) fn classify(err: rpc::Error) -> Error {
    use tonic::Code;
    match err {
        rpc::Error::Status(status) => {
            let mut message = format!("{} ({:?})", status.message(), status.code());
            // A transport failure ("tcp connect error") says why only in its sources.
            let mut source = std::error::Error::source(&status);
            while let Some(cause) = source {
                message.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            match status.code() {
                // A lease this call granted expired before the transaction that attaches it
                // (a stall longer than the TTL): nothing was written; retry with a new grant.
                Code::NotFound if status.message().contains("lease not found") => {
                    Error::unavailable(BACKEND, format!("{message}: the call outlived the lease it granted; retry"))
                }
                // A token refused even after a refresh (the member lost its auth state, a
                // refresh raced a second user change): nothing was applied; retryable, and
                // the next call goes to another member.
                _ if status.message().contains("invalid auth token")
                    || status.message().contains("revision of auth store is old") =>
                {
                    Error::unavailable(BACKEND, format!("{message}: the auth token was refreshed; retry"))
                }
                Code::InvalidArgument if status.message().contains("authentication failed") => {
                    Error::misconfigured(
                        BACKEND,
                        format!("{message}: check the user and password in the URL"),
                    )
                }
                Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Aborted
                | Code::Cancelled
                | Code::Unknown
                | Code::Internal => Error::unavailable(BACKEND, message),
                // "database space exceeded" (NOSPACE): writes fail until an operator compacts
                // and defragments; retrying cannot help.
                Code::ResourceExhausted => Error::misconfigured(
                    BACKEND,
                    format!("{message}: compact and defragment etcd, or raise --quota-backend-bytes"),
                ),
                Code::Unauthenticated | Code::PermissionDenied => Error::misconfigured(
                    BACKEND,
                    format!("{message}: check the user and password in the URL and its role's key range"),
                ),
                Code::FailedPrecondition if status.message().contains("auth") => {
                    Error::misconfigured(BACKEND, message)
                }
                Code::InvalidArgument if status.message().contains("too many operations") => {
                    Error::misconfigured(
                        BACKEND,
                        format!("{message}: etcd's --max-txn-ops must be at least 128"),
                    )
                }
                Code::InvalidArgument if status.message().contains("too large") => {
                    Error::misconfigured(
                        BACKEND,
                        format!("{message}: etcd's --max-request-bytes must be at least 2 MiB"),
                    )
                }
                _ => Error::backend(BACKEND, message),
            }
        }
        rpc::Error::Transport(e) => Error::unavailable(BACKEND, e.to_string()),
        rpc::Error::InvalidUri(e) => Error::misconfigured(BACKEND, e),
        rpc::Error::InvalidArgs(e) => Error::misconfigured(BACKEND, e),
    }
}

/// Whether etcd refused a request for its auth token: expired or invalid ("invalid auth
/// token"), or issued before a user or role changed ("revision of auth store is old"). etcd
/// refuses both before applying anything, so the request can be sent again with a fresh token.
pub(crate) fn is_stale_token(err: &rpc::Error) -> bool {
    match err {
        rpc::Error::Status(status) => {
            let message = status.message();
            message.contains("invalid auth token")
                || message.contains("revision of auth store is old")
        }
        _ => false,
    }
}

/// Whether etcd refused a request before applying anything, in a way a new attempt can get
/// past: "no leader" (the member has none: the client asks for one on every request, and etcd
/// refuses in its interceptor before the handler runs) and "leader changed" (a linearizable
/// read cut while it waited for the read index; etcd answers it only on that path, before
/// reading anything).
pub(crate) fn is_refused_unapplied(err: &rpc::Error) -> bool {
    matches!(err, rpc::Error::Status(status)
        if status.code() == tonic::Code::Unavailable
            && (status.message() == "etcdserver: no leader"
                || status.message() == "etcdserver: leader changed"))
}

/// A call that did not finish within the client-side bound: it may or may not have been applied.
pub(crate) fn timed_out(what: &str, bound: std::time::Duration) -> Error {
    Error::unavailable(
        BACKEND,
        format!("{what} did not answer within {} ms", bound.as_millis()),
    )
}
