#![doc = include_str!("../README.md")]

mod config;

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
    NewRun, Result, Retention, RunCounts, RunId, RunRecord, RunState, RunTimes, StoreTime, Ttl,
    WorkerId, DEFAULT_KIND, LONGEST_HELD_SCAN, MAX_ATTEMPT_ERROR_BYTES, MAX_BATCH,
    MAX_BATCH_PAYLOAD_BYTES, MAX_COUNT, MAX_HISTORY, MAX_ID_BYTES, MAX_KINDS_COUNTED,
    MAX_KIND_BYTES, MAX_LIST, MAX_PAYLOAD_BYTES, MAX_PRIORITY, MAX_PURGE_AGE, MAX_REASON_BYTES,
    MAX_RETRY_DELAY, MAX_RUN_PAYLOAD_BYTES, MAX_START_DELAY, REBIND_FENCE_STEP,
};
pub use lease_runtime::{
    min_margin, observe, CancelReason, CancellationToken, EndReport, Handler, HandlerFuture,
    HeartbeatStats, Heartbeats, Instrumented, Kinds, MemoryLeaseStore, MemoryTransaction, Purger,
    PurgerReport, RetryPolicy, RunContext, RunScope, Schedule, Scheduler, SchedulerReport,
    ScopeConfig, TickReport, Worker, WorkerConfig, WorkerReport, DEFAULT_PURGER_NAME,
    DEFAULT_PURGE_BATCH, DEFAULT_PURGE_EVERY, DEFAULT_RETENTION_AGE, PURGER_KIND,
};

/// Why a run's payload could not be read as a handler's arguments (the `serde` feature).
#[cfg(feature = "serde")]
pub use lease_runtime::ArgsError;

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

#[cfg(test)]
mod tests {
    /// The README's metrics table lists every series the library reports, with its type.
    #[test]
    fn every_metric_is_in_the_readme_table() {
        let readme = include_str!("../README.md");
        for (name, kind, ..) in lease_runtime::observe::SERIES {
            let row = format!("| `{name}` | {kind} |");
            assert!(readme.contains(&row), "README lacks the row {row}");
        }
    }
}
