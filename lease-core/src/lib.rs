//! The lease contract: TTL leases on runs, guarded by fencing tokens.
//!
//! A worker claims a run under a [`Lease`] with a TTL and a [`Fence`]; the store increments the
//! run's fence on every successful claim and rejects any write whose fence is lower than the
//! stored one ([`Error::StaleFence`]). A paused or partitioned worker that comes back after
//! someone else reclaimed its run is therefore fenced out by an integer comparison in the store,
//! not by a clock.
//!
//! - [`LeaseStore`]: the object-safe trait every backend implements; its docs are the contract.
//! - [`RunScope`]: the worker side; heartbeats a lease and cancels the run's work before the
//!   lease can be lost.
//! - [`Heartbeats`]: a worker-wide heartbeat renewing all its scopes' leases in batches.
//! - [`Worker`]: the claim → handle → end loop, with group-committed ends and a graceful
//!   shutdown that hands its runs over at once.
//! - [`MemoryLeaseStore`]: the embedded reference backend.
//! - [`FaultyStore`]: injects hangs and failures into any store, for partition tests.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
//! use std::time::Duration;
//! use lease_core::{Error, LeaseStore, MemoryLeaseStore, RunId, Ttl, WorkerId};
//!
//! let store = MemoryLeaseStore::new();
//! let run = RunId::new("order-42")?;
//! store.create(&run).await?;
//! let a = store.claim(&run, &WorkerId::new("a")?, Ttl::from_millis(20)?).await?;
//! tokio::time::sleep(Duration::from_millis(30)).await; // a's lease expires: a was paused
//! let b = store.claim(&run, &WorkerId::new("b")?, Ttl::from_secs(30)?).await?;
//! assert_eq!((a.fence().get(), b.fence().get()), (1, 2));
//! // a comes back and writes: the store rejects it by fence.
//! let err = store.append(&a, b"charge card").await.unwrap_err();
//! assert!(matches!(err, Error::StaleFence { presented: 1, current: 2, .. }));
//! # Ok(()) }
//! ```

mod attempt;
pub mod backend;
mod effect;
mod error;
mod fault;
mod heartbeats;
mod id;
mod kind;
pub mod limits;
mod memory;
mod new_run;
pub mod observe;
mod policy;
mod redact;
mod refresh;
mod retention;
mod schedule;
mod scope;
mod store;
mod types;
mod wake;
mod wake_listener;
mod worker;

pub use attempt::{attempt_error, Attempt, AttemptOutcome};
pub use effect::Effect;
pub use error::{BoxError, Ended, Error, InvalidInput, Result};
pub use fault::{Fault, FaultyStore, ReplyFault, FAULT_BACKEND};
pub use heartbeats::{HeartbeatStats, Heartbeats, TickReport};
pub use id::{IdempotencyKey, RunId, WorkerId};
pub use kind::{refuse_kinds, Kind, KindCounts, DEFAULT_KIND};
pub use limits::{
    LONGEST_HELD_SCAN, MAX_ATTEMPT_ERROR_BYTES, MAX_BATCH, MAX_BATCH_PAYLOAD_BYTES, MAX_COUNT,
    MAX_HISTORY, MAX_ID_BYTES, MAX_KINDS_COUNTED, MAX_KIND_BYTES, MAX_LIST, MAX_PAYLOAD_BYTES,
    MAX_PRIORITY, MAX_PURGE_AGE, MAX_REASON_BYTES, MAX_RETRY_DELAY, MAX_RUN_PAYLOAD_BYTES,
    MAX_START_DELAY, MAX_WAKE_DELAY, REBIND_FENCE_STEP,
};
pub use memory::{MemoryLeaseStore, MemoryTransaction};
pub use new_run::{refuse_priorities, NewRun};
pub use observe::Instrumented;
pub use policy::{EndedStates, Retention, DEFAULT_COMPLETED_RETENTION, DEFAULT_FAILED_RETENTION};
pub use redact::{redact_url, REDACTED, UNPARSEABLE_URL};
pub use retention::{
    Purger, PurgerReport, DEFAULT_PURGER_NAME, DEFAULT_PURGE_BATCH, DEFAULT_PURGE_EVERY,
    DEFAULT_RETENTION_AGE, PURGER_KIND,
};
pub use schedule::{Schedule, Scheduler, SchedulerReport, MAX_INTERVAL, MAX_SCHEDULE_NAME_BYTES};
pub use scope::{min_margin, CancelReason, RunScope, ScopeConfig};
pub use store::{LeaseStore, LeaseStoreExt};
pub use types::{
    sanitize_reason, End, Ending, Fence, JournalEntry, Lease, ListFilter, RunCounts, RunRecord,
    RunState, RunTimes, StoreTime, Ttl,
};
pub use wake::{parse_kind_delay, Wake, WakeReceiver, Wakes};
pub use wake_listener::{OpenSession, WakeListener, WakeSession};
#[cfg(feature = "serde")]
pub use worker::ArgsError;
pub use worker::{
    EndReport, Handler, HandlerFuture, Kinds, RetryPolicy, RunContext, Worker, WorkerConfig,
    WorkerReport, DEFAULT_WAKE_POLL,
};

/// Re-exported so callers and backends name the same token type.
pub use tokio_util::sync::CancellationToken;
