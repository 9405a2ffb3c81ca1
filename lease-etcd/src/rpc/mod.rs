//! A thin etcd v3 client over gRPC: the calls this adapter, its tests and its benchmark make,
//! and nothing else. It replaces the `etcd-client` crate, whose build compiles etcd's .proto
//! files and needs `protoc`: the messages and gRPC stubs here are generated once, in Rust
//! (`lease-etcd/codegen`), and committed under `generated/`.
//!
//! Public only so that the crate's integration tests and benchmark can reach etcd directly;
//! it is not part of the crate's supported API and may change in any release.
//!
//! What it keeps of `etcd-client`'s behaviour, as the adapter relied on it:
//! - one [`Client`] per endpoint list, each call bounded by the per-request timeout and each
//!   connection by the connect timeout, with HTTP/2 keep-alive pings (also while idle);
//! - with a user, `Authenticate` at connect and the token sent as `token` metadata on every
//!   call; a call refused for an invalid token is sent once more after authenticating again
//!   (when [`ConnectOptions::with_auto_token_refresh`] is on), and
//!   [`Client::refresh_token`] authenticates again on demand;
//! - `hasleader: true` metadata on every call with
//!   [`ConnectOptions::with_require_leader`] (etcd then answers "no leader" at once);
//! - `https://` endpoints through rustls with the platform's roots (the crate's `tls`
//!   feature).

mod client;
#[rustfmt::skip]
pub mod generated;
mod kv;
mod watch;

#[cfg(feature = "tls")]
pub use client::TlsOptions;
pub use client::{
    Client, ConnectOptions, KvClient, LeaseClient, LeaseGrantResponse, LeaseTimeToLiveResponse,
    LockResponse, MaintenanceClient, StatusResponse, UnlockResponse,
};
pub use kv::{
    Compare, CompareOp, DeleteOptions, DeleteResponse, GetOptions, GetResponse, KeyValue,
    PutOptions, PutResponse, ResponseHeader, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
pub use watch::{Event, EventType, WatchFilterType, WatchOptions, WatchResponse, WatchStream};

/// Why a call failed. Its `Display` and `Debug` hold etcd's answer or the transport's error,
/// never the credentials the client was given.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// etcd (or the gRPC layer in front of it) answered with a non-OK status.
    #[error("grpc request error: {0}")]
    Status(#[from] tonic::Status),
    /// The connection could not be set up (TLS configuration, endpoint settings).
    #[error("transport error: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// An endpoint that is not a valid URI.
    #[error("invalid uri: {0}")]
    InvalidUri(String),
    /// Arguments the client refuses before sending anything (no endpoint, `https://` without
    /// the `tls` feature).
    #[error("invalid arguments: {0}")]
    InvalidArgs(String),
}

/// What a call of this client returns.
pub type Result<T> = std::result::Result<T, Error>;
