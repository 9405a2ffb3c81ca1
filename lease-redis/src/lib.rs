#![doc = include_str!("../README.md")]

mod call;
mod config;
mod error;
#[cfg(test)]
mod fuzz_url;
mod guard;
mod keys;
mod link;
mod reply;
mod store;

pub use config::RedisConfig;
pub use keys::MAX_NAMESPACE_BYTES;
pub use store::{FencedScript, RedisLeaseStore};
