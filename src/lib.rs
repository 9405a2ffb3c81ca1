#![doc = include_str!("../README.md")]

mod config;

pub use config::{
    check_namespace, connect, connect_store, Backend, Config, ConfigError, Store,
    MAX_NAMESPACE_BYTES,
};

// What a user of the library needs. The backend author's helpers (input checks, verdict
// rules) stay in `lease_core::backend`.
pub use lease_core::{
    attempt_error, min_margin, observe, redact_url, sanitize_reason, Attempt, AttemptOutcome,
    BoxError, CancelReason, CancellationToken, Effect, End, EndReport, Ended, EndedStates, Ending,
    Error, Fence, Handler, HandlerFuture, HeartbeatStats, Heartbeats, IdempotencyKey, Instrumented,
    InvalidInput, JournalEntry, Kind, KindCounts, Kinds, Lease, LeaseStore, LeaseStoreExt,
    ListFilter, MemoryLeaseStore, MemoryTransaction, NewRun, Purger, PurgerReport, Result,
    Retention, RetryPolicy, RunContext, RunCounts, RunId, RunRecord, RunScope, RunState, RunTimes,
    Schedule, Scheduler, SchedulerReport, ScopeConfig, StoreTime, TickReport, Ttl, Worker,
    WorkerConfig, WorkerId, WorkerReport, DEFAULT_KIND, DEFAULT_PURGER_NAME, DEFAULT_PURGE_BATCH,
    DEFAULT_PURGE_EVERY, DEFAULT_RETENTION_AGE, LONGEST_HELD_SCAN, MAX_ATTEMPT_ERROR_BYTES,
    MAX_BATCH, MAX_BATCH_PAYLOAD_BYTES, MAX_COUNT, MAX_HISTORY, MAX_ID_BYTES, MAX_KINDS_COUNTED,
    MAX_KIND_BYTES, MAX_LIST, MAX_PAYLOAD_BYTES, MAX_PRIORITY, MAX_PURGE_AGE, MAX_REASON_BYTES,
    MAX_RETRY_DELAY, MAX_RUN_PAYLOAD_BYTES, MAX_START_DELAY, PURGER_KIND, REBIND_FENCE_STEP,
};

/// Why a run's payload could not be read as a handler's arguments (the `serde` feature).
#[cfg(feature = "serde")]
pub use lease_core::ArgsError;

/// Fault injection for tests of code built on the library: a store wrapper that hangs, fails
/// or delays calls and their replies, as a network would.
pub mod testing {
    pub use lease_core::{Fault, FaultyStore, ReplyFault, FAULT_BACKEND};
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

#[cfg(test)]
mod tests {
    /// The README's metrics table lists every series the library reports, with its type.
    #[test]
    fn every_metric_is_in_the_readme_table() {
        let readme = include_str!("../README.md");
        for (name, kind, ..) in lease_core::observe::SERIES {
            let row = format!("| `{name}` | {kind} |");
            assert!(readme.contains(&row), "README lacks the row {row}");
        }
    }
}
