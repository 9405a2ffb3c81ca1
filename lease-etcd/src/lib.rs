//! etcd backend for [`lease_core`]: fences in Raft-replicated keys, expiry timed by etcd's
//! own leases, every claim and fenced write one etcd transaction.
//!
//! ```no_run
//! # async fn demo() -> lease_core::Result<()> {
//! use lease_core::{LeaseStore, RunId, Ttl, WorkerId};
//! use lease_etcd::{EtcdConfig, EtcdLeaseStore};
//!
//! let config = EtcdConfig::from_url("etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/jobs")?;
//! let store = EtcdLeaseStore::connect(config).await?;
//! let run = RunId::new("order-42")?;
//! store.create(&run).await?;
//! let lease = store.claim(&run, &WorkerId::new("w1")?, Ttl::from_secs(30)?).await?;
//! store.complete(&lease).await?;
//! # Ok(()) }
//! ```
//!
//! See the crate README for the design, the pitfalls it handles, and how to add a backend.

mod codec;
mod config;
mod error;
#[doc(hidden)]
pub mod rpc;
mod store;

pub use config::{
    EtcdConfig, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_LEASE, DEFAULT_PREFIX, DEFAULT_TIMEOUT,
};
pub use store::{EtcdLeaseStore, Rebound, MIN_TTL, SCAN_BUDGET};
