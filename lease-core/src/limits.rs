//! Every number the contract fixes, in one place: the bounds a backend must agree on (the
//! stores check input against them before any I/O, and the SQL and Lua that need one get it
//! from here, rendered into the statement or script as it is loaded), and the bounds on one
//! call's work. Change one here and every backend follows; nothing else in the workspace
//! spells these numbers.

use std::time::Duration;

// --- Identifiers -----------------------------------------------------------------------

/// The longest identifier accepted, in bytes of UTF-8.
pub const MAX_ID_BYTES: usize = 255;

/// The longest kind accepted, in bytes of UTF-8.
pub const MAX_KIND_BYTES: usize = 64;

/// The longest queue name accepted, in bytes of UTF-8.
pub const MAX_QUEUE_BYTES: usize = 64;

/// The most queues [`queues`](crate::LeaseStore::queues) lists.
pub const MAX_QUEUES_LISTED: usize = 1000;

// --- Runs and their payloads -----------------------------------------------------------

/// The largest payload a run may be created with
/// ([`NewRun::with_payload`](crate::NewRun::with_payload)): 64 KiB. A run's data is read with
/// every claim, so it is kept small; a batch of [`MAX_BATCH`] runs at the bound is
/// [`MAX_BATCH_PAYLOAD_BYTES`]. Larger data belongs in the caller's storage, named by the
/// payload.
pub const MAX_RUN_PAYLOAD_BYTES: usize = 64 << 10;

/// The longest journal payload accepted: 1 MiB.
pub const MAX_PAYLOAD_BYTES: usize = 1 << 20;

/// The highest priority a run can be created with ([`NewRun::with_priority`](crate::NewRun::with_priority)); priorities are
/// 0 (the default, the lowest) to this, and higher ones are claimed first.
pub const MAX_PRIORITY: u8 = 9;

/// The longest a run may be created not claimable for ([`NewRun::with_delay`](crate::NewRun::with_delay),
/// [`NewRun::with_run_at`](crate::NewRun::with_run_at)): 366 days, so a job can be planned a
/// year ahead, leap years included. Every backend times it as it times a retry delay (Postgres
/// and Redis on their clock, etcd in lease links); a retry's own delay stays at most
/// [`MAX_RETRY_DELAY`].
pub const MAX_START_DELAY: Duration = Duration::from_secs(366 * 86_400);

// --- Signals ---------------------------------------------------------------------------

/// The longest [`SignalName`](crate::SignalName), in bytes of UTF-8.
pub const MAX_SIGNAL_BYTES: usize = 64;
/// The largest payload a signal delivers: 64 KiB, as a run's own payload (it is read with
/// every claim of the resumed run).
pub const MAX_SIGNAL_PAYLOAD_BYTES: usize = 64 << 10;
/// The longest a run waits for a signal ([`End::await_signal`](crate::End::await_signal)): 366
/// days, as a start delay.
pub const MAX_WAIT: Duration = MAX_START_DELAY;

// --- Ends ------------------------------------------------------------------------------

/// The longest delay an [`End::RetryAfter`](crate::End::RetryAfter) accepts: 30 days.
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(30 * 86_400);

/// The longest failure reason an [`End::Fail`](crate::End::Fail) accepts: 4 KiB of UTF-8. The
/// `Worker` (lease-runtime) cuts a handler's error message to fit.
pub const MAX_REASON_BYTES: usize = 4096;

// --- The attempt history ---------------------------------------------------------------

/// How many attempts a run's history keeps: the last 10, oldest first. An older attempt is
/// dropped when a newer one is written.
pub const MAX_HISTORY: usize = 10;

/// The longest error text an [`Attempt`](crate::Attempt) keeps, in bytes: a longer reason is cut at the last
/// character boundary within it ([`attempt_error`](crate::attempt_error)). The run's own
/// [`failure`](crate::RunRecord::failure) keeps the whole reason.
pub const MAX_ATTEMPT_ERROR_BYTES: usize = 1024;

// --- Batches and reads -----------------------------------------------------------------

/// The most leases one `claim_next` or `renew_many` call handles.
pub const MAX_BATCH: usize = 1_000;

/// The most payload bytes one [`end_many`](crate::LeaseStore::end_many) batch may carry in
/// total (its complete-with effects together): 64 MiB, well inside what one Postgres message
/// or one Redis command may hold, so a batch is decided item by item instead of failing whole.
pub const MAX_BATCH_PAYLOAD_BYTES: usize = 64 << 20;

/// The most runs one `list` call returns.
pub const MAX_LIST: usize = 10_000;

/// The largest figure [`count`](crate::LeaseStore::count) reports: one million per state.
pub const MAX_COUNT: u64 = 1_000_000;

/// The most kinds one [`count_kinds`](crate::LeaseStore::count_kinds) reports: the first 100
/// by name. A call's work is bounded by it (and each figure by [`MAX_COUNT`]).
pub const MAX_KINDS_COUNTED: usize = 100;

/// The most held or delayed runs whose records the Redis store reads per
/// [`count`](crate::LeaseStore::count) to find the [longest-held lease](crate::RunCounts::longest_held)
/// (it keeps no index by claim time): a thousand, about 4 ms of the server on the benchmark
/// machine (BENCHMARKS.md). Beyond that many held or delayed runs the figure is the longest
/// among the thousand whose index entries come first (the leases expiring soonest).
pub const LONGEST_HELD_SCAN: usize = 1_000;

// --- Retention and restores ------------------------------------------------------------

/// The oldest age a [`purge`](crate::LeaseStore::purge) accepts: 100 years.
pub const MAX_PURGE_AGE: Duration = Duration::from_secs(100 * 365 * 86_400);

/// How far a rebind after a restore (`lease pg-rebind`, `lease redis-rebind`) raises every
/// run's fence and the fence floor: more claims than the history after a backup could have
/// made, so no fence that history issued is issued again, and its holders' writes are refused
/// as stale. Applied at each rebind, never undone.
pub const REBIND_FENCE_STEP: u64 = 1 << 32;

// --- Wake-ups --------------------------------------------------------------------------

/// The longest delay a wake-up is scheduled for locally; a run claimable later than this is
/// found by the fallback poll.
pub const MAX_WAKE_DELAY: Duration = Duration::from_secs(3600);
