//! The runtime of the lease library, on Tokio: what keeps leases, runs handlers under them and
//! looks after a store, built on the contract of [`lease_core`].
//!
//! - [`RunScope`]: the worker side of one lease; heartbeats it and cancels the run's work
//!   before the lease can be lost.
//! - [`Heartbeats`]: a worker-wide heartbeat renewing all its scopes' leases in batches.
//! - [`JobArgs`], [`InsertExt::insert`] and [`InsertOpts`]: typed jobs, inserted on any store
//!   and served, decoded, by [`Kinds::job`].
//! - [`Worker`]: the claim → handle → end loop, with group-committed ends, retries with
//!   backoff and a graceful shutdown that hands its runs over at once; [`Kinds`] serves
//!   several kinds from one worker.
//! - [`Purger`]: removes ended runs past their [`Retention`](lease_core::Retention).
//! - [`Schedule`] and [`Scheduler`]: periodic runs, one per tick.
//! - [`observe`]: the metrics every part reports, and [`Instrumented`], a store wrapper that
//!   records every call.
//! - [`WakeListener`]: the task that listens for a backend's wake-ups (the backends of this
//!   workspace use it); [`WakesExt`]: delayed wake-ups.
//! - [`MemoryLeaseStore`]: the embedded reference backend, on Tokio's clock (so tests with a
//!   paused clock drive its leases).
//! - [`FaultyStore`]: injects hangs and failures into any store, for partition tests.
//!
//! The contract itself (the [`LeaseStore`](lease_core::LeaseStore) trait, ids, records,
//! errors, verdict rules) is `lease-core`, re-exported here as [`lease_core`] so that both name
//! the same version. Most applications use both through the `distribution` crate.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
//! use std::sync::Arc;
//! use lease_core::{LeaseStore, RunId, Ttl, WorkerId};
//! use lease_runtime::{MemoryLeaseStore, RunScope, ScopeConfig};
//!
//! let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
//! let run = RunId::new("order-42")?;
//! store.create(&run).await?;
//! let ttl = Ttl::from_secs(30)?;
//! let scope = RunScope::claim(store.clone(), &run, &WorkerId::new("a")?, ttl, ScopeConfig::default()).await?;
//! // The lease is renewed in the background until the scope ends; its token is cancelled
//! // before the lease could be lost.
//! assert!(!scope.token().is_cancelled());
//! scope.complete().await?;
//! # Ok(()) }
//! ```

mod fault;
mod heartbeats;
mod jobs;
mod memory;
pub mod observe;
mod refresh;
mod retention;
mod schedule;
mod scope;
pub mod trace;
mod wake;
mod wake_listener;
mod worker;

pub use fault::{Fault, FaultyStore, ReplyFault, FAULT_BACKEND};
pub use heartbeats::{HeartbeatStats, Heartbeats, TickReport};
pub use jobs::{new_run_id, ArgsError, InsertExt, InsertOpts, Inserted, JobArgs};
pub use memory::{MemoryLeaseStore, MemoryTransaction};
pub use observe::Instrumented;
pub use retention::{
    Purger, PurgerReport, DEFAULT_PURGER_NAME, DEFAULT_PURGE_BATCH, DEFAULT_PURGE_EVERY,
    DEFAULT_RETENTION_AGE, PURGER_KIND,
};
pub use schedule::{Schedule, Scheduler, SchedulerReport, MAX_INTERVAL, MAX_SCHEDULE_NAME_BYTES};
pub use scope::{min_margin, CancelReason, RunScope, ScopeConfig};
pub use wake::WakesExt;
pub use wake_listener::{OpenSession, WakeListener, WakeSession};
pub use worker::{
    EndReport, Handler, HandlerFuture, KindPolicy, Kinds, RetryPolicy, RunContext, Worker,
    WorkerConfig, WorkerReport, DEFAULT_WAKE_POLL,
};

/// The contract this runtime is built on, re-exported so that a user of the runtime names the
/// same version of it.
pub use lease_core;
/// Re-exported so callers and backends name the same token type.
pub use tokio_util::sync::CancellationToken;
