#![doc = include_str!("../README.md")]

mod config;

pub use config::{
    check_namespace, connect, connect_store, Backend, Config, ConfigError, Store,
    MAX_NAMESPACE_BYTES,
};

pub use lease_core::*;
/// The Postgres backend.
pub use lease_postgres as postgres;
/// The Redis backend.
pub use lease_redis as redis;
