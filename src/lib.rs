//! Durable runs (jobs) under TTL leases with fencing tokens, on Postgres, Redis or etcd.
//!
//! A worker claims a run under a lease, keeps it with heartbeats and ends it: completed, with
//! an effect, released, suspended, retried or failed. Every claim takes a new fence, a `u64`
//! the worker presents on every write, and the store refuses a write whose fence is not the
//! run's current one. A worker that was paused or cut off while another took its run over is
//! refused with [`Error::StaleFence`]: its late writes are rejected, not merely late.
//!
//! This crate is the facade. It holds:
//!
//! - [`Config`] and [`connect`]: a store chosen by URL (`postgres://`, `redis://`,
//!   `redis+cluster://`, `redis+sentinel://`, `etcd://`, `memory:`), from a TOML file, the
//!   `LEASE_*` environment variables or code.
//! - The contract, from `lease-core`: [`LeaseStore`], its ids ([`RunId`], [`WorkerId`],
//!   [`Kind`]), [`NewRun`], [`Lease`], [`RunRecord`], [`End`], [`Error`] and the limits.
//! - The runtime, from `lease-runtime`: [`Worker`] and [`Kinds`], [`RunScope`] and
//!   [`Heartbeats`], [`Scheduler`], [`Purger`], [`MemoryLeaseStore`], and [`observe`] for
//!   metrics and tracing.
//! - The backends, one Cargo feature each: `postgres` and `redis` (default), `etcd`.
//! - [`testing`]: a store wrapper that injects faults.
//!
//! The [`guide`] explains the library chapter by chapter: workers, retries, jobs, retention,
//! exactly-once effects, guarantees, backends, metrics.

mod config;
pub mod guide;

pub use config::{
    check_namespace, connect, connect_store, Backend, Config, ConfigError, Store,
    MAX_NAMESPACE_BYTES,
};

// What a user of the library needs: the contract (`lease-core`) and the runtime built on it
// (`lease-runtime`), under one path. The backend author's helpers (input checks, verdict
// rules) stay in `lease_core::backend`.
pub use lease_core::{
    attempt_error, forward, redact_url, sanitize_reason, Attempt, AttemptOutcome, BoxError,
    Capabilities, Effect, End, Ended, EndedStates, Ending, Error, Fence, IdempotencyKey,
    InvalidInput, JournalEntry, Kind, KindCounts, Lease, LeaseStore, LeaseStoreExt, ListFilter,
    NewRun, Queue, QueueState, Result, Retention, RunCounts, RunId, RunRecord, RunState, RunTimes,
    Signal, SignalExt, SignalKey, SignalName, SignalRefusal, SignalToken, Signalled, StoreTime,
    TraceParent, Ttl, Wait, WaitEnd, WorkerId, DEFAULT_KIND, DEFAULT_QUEUE, LONGEST_HELD_SCAN,
    MAX_ATTEMPT_ERROR_BYTES, MAX_BATCH, MAX_BATCH_PAYLOAD_BYTES, MAX_COUNT, MAX_HISTORY,
    MAX_ID_BYTES, MAX_KINDS_COUNTED, MAX_KIND_BYTES, MAX_LIST, MAX_PAYLOAD_BYTES, MAX_PRIORITY,
    MAX_PURGE_AGE, MAX_QUEUES_LISTED, MAX_QUEUE_BYTES, MAX_REASON_BYTES, MAX_RETRY_DELAY,
    MAX_RUN_PAYLOAD_BYTES, MAX_SIGNAL_BYTES, MAX_SIGNAL_PAYLOAD_BYTES, MAX_START_DELAY, MAX_WAIT,
    REBIND_FENCE_STEP,
};
pub use lease_runtime::{
    min_margin, observe, trace, CancelReason, CancellationToken, EndReport, Handler, HandlerFuture,
    HeartbeatStats, Heartbeats, InsertExt, InsertOpts, Inserted, Instrumented, JobArgs, KindPolicy,
    Kinds, MemoryLeaseStore, MemoryTransaction, Purger, PurgerReport, RetryPolicy, RunContext,
    RunScope, Schedule, Scheduler, SchedulerReport, ScopeConfig, TickReport, Worker, WorkerConfig,
    WorkerReport, DEFAULT_PURGER_NAME, DEFAULT_PURGE_BATCH, DEFAULT_PURGE_EVERY,
    DEFAULT_RETENTION_AGE, PURGER_KIND,
};

/// Why a run's payload could not be read as a handler's arguments.
pub use lease_runtime::{new_run_id, ArgsError};

/// Fault injection for tests of code built on the library: a store wrapper that hangs, fails
/// or delays calls and their replies, as a network would.
pub mod testing {
    pub use lease_runtime::{Fault, FaultyStore, ReplyFault, FAULT_BACKEND};
}
/// The etcd backend (the `etcd` feature).
#[cfg(feature = "etcd")]
pub use lease_etcd as etcd;
/// The Postgres backend (the `postgres` feature).
#[cfg(feature = "postgres")]
pub use lease_postgres as postgres;
/// The Redis backend (the `redis` feature).
#[cfg(feature = "redis")]
pub use lease_redis as redis;

/// The README's example, compiled as a doc test: the README is no longer this crate's front
/// page, and its code would otherwise go unchecked.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

#[cfg(test)]
mod tests {
    /// The guide's metrics table lists every series the library reports, with its type.
    #[test]
    fn every_metric_is_in_the_guide_table() {
        let chapter = include_str!("../docs/guide/metrics.md");
        for (name, kind, ..) in lease_runtime::observe::SERIES {
            let row = format!("| `{name}` | {kind} |");
            assert!(
                chapter.contains(&row),
                "docs/guide/metrics.md lacks the row {row}"
            );
        }
    }
}
