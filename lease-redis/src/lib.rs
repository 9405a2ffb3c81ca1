#![doc = include_str!("../README.md")]

mod config;
mod error;
mod keys;
mod reply;
mod store;

pub use config::RedisConfig;
pub use keys::MAX_NAMESPACE_BYTES;
pub use store::{FencedScript, RedisLeaseStore};
