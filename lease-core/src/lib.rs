//! The lease contract: TTL leases on runs, guarded by fencing tokens.
//!
//! A worker claims a run under a [`Lease`] with a TTL and a [`Fence`]; the store increments the
//! run's fence on every successful claim and rejects any write whose fence is lower than the
//! stored one ([`Error::StaleFence`]). A paused or partitioned worker that comes back after
//! someone else reclaimed its run is therefore fenced out by an integer comparison in the store,
//! not by a clock.
//!
//! This crate is the contract every backend implements, and nothing that runs:
//!
//! - [`LeaseStore`]: the object-safe trait every backend implements; its docs are the contract.
//! - The values that cross it: ids ([`RunId`], [`WorkerId`], [`Kind`], [`IdempotencyKey`]),
//!   [`Lease`], [`Fence`], [`Ttl`], [`RunRecord`], [`NewRun`], [`End`] and [`Ending`],
//!   [`Effect`], attempts ([`Attempt`]), counts, [`EndedStates`] and [`Retention`], and the
//!   errors ([`Error`], [`InvalidInput`]).
//! - [`backend`]: the input checks and the verdict rules ([`backend::fenced_verdict`],
//!   [`backend::claim_refusal`]) every backend applies the same way.
//! - [`Wakes`]: the channel a store's wake-ups come through (the type
//!   [`LeaseStore::wakes`] returns).
//!
//! The runtime built on it (`Worker`, `RunScope` and its heartbeats, the `Purger`, the
//! `Scheduler`, the metrics and the `Instrumented` wrapper, the wake-up listener,
//! `FaultyStore` and the embedded `MemoryLeaseStore`) is the `lease-runtime` crate; most
//! applications use both through the `distribution` crate.
//!
//! Dependencies: no async runtime. Tokio comes with its `sync` feature only, for the
//! broadcast channel inside [`Wakes`]; nothing here spawns a task, sleeps or reads a clock
//! other than the store's.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
//! use std::time::Duration;
//! use lease_core::{Error, LeaseStore, RunId, Ttl, WorkerId};
//! use lease_runtime::MemoryLeaseStore;
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
pub mod capabilities;
mod effect;
mod error;
pub mod forward;
mod id;
mod kind;
pub mod limits;
pub mod machine;
mod name;
mod new_run;
mod policy;
mod queue;
mod redact;
pub mod signal;
mod store;
mod trace;
mod types;
mod wake;

pub use attempt::{attempt_error, Attempt, AttemptOutcome};
pub use capabilities::Capabilities;
pub use effect::Effect;
pub use error::{BoxError, Ended, Error, InvalidInput, Result};
pub use id::{IdempotencyKey, RunId, WorkerId};
pub use kind::{refuse_kinds, Kind, KindCounts, DEFAULT_KIND};
pub use limits::{
    LONGEST_HELD_SCAN, MAX_ATTEMPT_ERROR_BYTES, MAX_BATCH, MAX_BATCH_PAYLOAD_BYTES, MAX_COUNT,
    MAX_HISTORY, MAX_ID_BYTES, MAX_KINDS_COUNTED, MAX_KIND_BYTES, MAX_LIST, MAX_PAYLOAD_BYTES,
    MAX_PRIORITY, MAX_PURGE_AGE, MAX_QUEUES_LISTED, MAX_QUEUE_BYTES, MAX_REASON_BYTES,
    MAX_RETRY_DELAY, MAX_RUN_PAYLOAD_BYTES, MAX_SIGNAL_BYTES, MAX_SIGNAL_PAYLOAD_BYTES,
    MAX_START_DELAY, MAX_WAIT, MAX_WAKE_DELAY, REBIND_FENCE_STEP,
};
pub use new_run::{refuse_priorities, refuse_unique_keys, NewRun};
pub use policy::{EndedStates, Retention, DEFAULT_COMPLETED_RETENTION, DEFAULT_FAILED_RETENTION};
pub use queue::{refuse_queues, Queue, QueueState, DEFAULT_QUEUE};
pub use redact::{redact_url, REDACTED, UNPARSEABLE_URL};
pub use signal::{
    Signal, SignalExt, SignalKey, SignalName, SignalRefusal, SignalToken, Signalled, Wait, WaitEnd,
};
pub use store::{LeaseStore, LeaseStoreExt};
pub use trace::{TraceParent, TRACE_PARENT_LEN};
pub use types::{
    sanitize_reason, End, Ending, Fence, JournalEntry, Lease, ListFilter, RunCounts, RunRecord,
    RunState, RunTimes, StoreTime, Ttl,
};
pub use wake::{parse_kind_delay, Wake, WakeReceiver, Wakes};
