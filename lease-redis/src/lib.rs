#![doc = include_str!("../README.md")]

mod admin;
mod call;
mod config;
mod epoch;
mod error;
mod fenced;
#[cfg(test)]
mod fuzz_url;
mod guard;
mod keys;
mod link;
mod reply;
mod signal;
mod store;
mod wake;
mod wire;

#[doc(hidden)]
pub use call::script_prelude;
pub use config::RedisConfig;
pub use epoch::{Rebound, REBIND_FENCE_STEP};
pub use fenced::FencedScript;
pub use keys::MAX_NAMESPACE_BYTES;
pub use store::{RedisLeaseStore, CLAIM_NEXT_SCAN};

/// The redis-rs this crate is built on, so callers of [`RedisLeaseStore::from_client`] and
/// [`RedisLeaseStore::fenced_script`] name the same types.
pub use redis;
