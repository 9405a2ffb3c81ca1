#![doc = include_str!("../README.md")]

mod batch;
mod binding;
mod config;
mod durable;
mod effect;
mod error;
#[cfg(test)]
mod fuzz_url;
mod in_tx;
mod insert_tx;
mod notify;
mod pooler;
mod route;
mod signal_tx;
mod store;
mod transaction;
mod wake;

pub use binding::{Rebound, REBIND_FENCE_STEP};
pub use config::{PostgresConfig, DEFAULT_SCHEMA};
pub use effect::{Bind, EffectFuture, PgEffect, MAX_EFFECTS_PER_TRANSACTION};
#[doc(hidden)]
pub use store::render_sql;
pub use store::{format_version, migrator, PostgresLeaseStore};
pub use transaction::FencedTransaction;

/// The sqlx this crate is built on, so callers of
/// [`PostgresLeaseStore::fenced_transaction`] and [`PostgresLeaseStore::pool`] name the same
/// types.
pub use sqlx;
