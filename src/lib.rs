#![doc = include_str!("../README.md")]

mod config;

pub use config::{connect, redact_url, Backend, Config, ConfigError};
pub use lease_core::*;
