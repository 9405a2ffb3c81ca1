//! The one error type every `LeaseStore` returns.

use std::fmt;
use std::time::Duration;

use crate::id::{RunId, WorkerId};
use crate::types::RunState;

/// A boxed error from a backend's driver.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a `LeaseStore` call did not do what was asked.
///
/// Variants are verdicts a caller acts on. Fence verdicts are decided by comparing integers in
/// the store: there is deliberately no "your lease expired" variant. A write under the current
/// fence after expiry, before anyone reclaimed the run, is accepted; once someone reclaims it the
/// fence has moved and the write fails with [`Error::StaleFence`].
///
/// ```
/// # use lease_core::{Error, Fence, Lease, LeaseStore};
/// # async fn write(store: &dyn LeaseStore, lease: &Lease) {
/// match store.append(lease, b"step 3 done").await {
///     Ok(entry) => println!("written as #{}", entry.seq),
///     Err(Error::StaleFence { presented, current, .. }) => {
///         println!("fenced out: we hold {presented}, the run is at {current}; stop working")
///     }
///     Err(e) if e.is_retryable() => println!("store unreachable, try again: {e}"),
///     Err(e) => println!("refused: {e}"),
/// }
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The run does not exist.
    #[error("run {run} not found")]
    NotFound {
        /// The run asked for.
        run: RunId,
    },
    /// `create` of a run that already exists.
    #[error("run {run} already exists")]
    AlreadyExists {
        /// The run asked for.
        run: RunId,
    },
    /// A claim refused because another lease on the run has not expired.
    #[error("run {run} is held by {owner} for another {remaining:?}")]
    Held {
        /// The run asked for.
        run: RunId,
        /// The current holder.
        owner: WorkerId,
        /// Time left on the holder's lease, by the store's clock.
        remaining: Duration,
    },
    /// A claim refused because the run is suspended.
    #[error("run {run} is suspended")]
    Suspended {
        /// The run asked for.
        run: RunId,
    },
    /// A claim refused because the run is completed.
    #[error("run {run} is completed")]
    Completed {
        /// The run asked for.
        run: RunId,
    },
    /// A claim refused because the run has failed ([`End::Fail`](crate::End::Fail)); `resume`
    /// puts it back.
    #[error("run {run} has failed; resume it to run it again")]
    Failed {
        /// The run asked for.
        run: RunId,
    },
    /// A claim (or `resume`, or `force_release`) refused because the run was cancelled
    /// ([`LeaseStore::cancel`](crate::LeaseStore::cancel)): terminal.
    #[error("run {run} was cancelled")]
    Cancelled {
        /// The run asked for.
        run: RunId,
    },
    /// A claim refused because the run was given back with a retry delay
    /// ([`End::RetryAfter`](crate::End::RetryAfter)) that has not passed on the store's clock.
    #[error("run {run} is not claimable for another {remaining:?} (a retry delay)")]
    Delayed {
        /// The run asked for.
        run: RunId,
        /// Time left before it is claimable, by the store's clock.
        remaining: Duration,
    },
    /// `resume` of a run that is neither suspended nor failed.
    #[error("run {run} is {state}, not suspended or failed")]
    NotSuspended {
        /// The run asked for.
        run: RunId,
        /// Its state.
        state: RunState,
    },
    /// A fenced write under a fence lower than the run's current one: someone claimed the run
    /// after this lease was issued.
    #[error("stale fence on run {run}: presented {presented}, current {current}")]
    StaleFence {
        /// The run written to.
        run: RunId,
        /// The fence the writer presented.
        presented: u64,
        /// The run's fence in the store.
        current: u64,
    },
    /// A fenced write under the current fence, on a lease its holder already ended.
    #[error("lease on run {run} under fence {fence} has ended: the run was {ended}")]
    LeaseEnded {
        /// The run written to.
        run: RunId,
        /// The fence presented, which is the run's current fence.
        fence: u64,
        /// How the lease ended.
        ended: Ended,
    },
    /// A fenced write under a fence the store never issued. Either the lease was forged, or the
    /// store lost state it had acknowledged (for example a Redis restart without persistence).
    #[error(
        "fence {presented} on run {run} is ahead of the store's {current}: \
         the store never issued it (did it lose acknowledged writes?)"
    )]
    FenceAhead {
        /// The run written to.
        run: RunId,
        /// The fence the writer presented.
        presented: u64,
        /// The run's fence in the store.
        current: u64,
    },
    /// The run's fence reached [`Fence::MAX`](crate::Fence::MAX); it can never be claimed again.
    #[error("run {run} has used every fence up to the maximum; it cannot be claimed again")]
    FenceExhausted {
        /// The run asked for.
        run: RunId,
    },
    /// The run was claimed past its attempt budget: every earlier attempt failed, timed out
    /// or vanished (a crash), so the claimer failed the run instead of running it again.
    #[error(
        "run {run} was claimed {attempts} times without finishing (max_attempts {max}): it is \
         failed; resume it to give it a fresh budget"
    )]
    AttemptsExhausted {
        /// The run.
        run: RunId,
        /// The attempts it used before this claim, none of which finished.
        attempts: u64,
        /// The budget.
        max: u64,
    },
    /// The [effect](crate::Effect) handed in with an end failed in the transaction that would
    /// have committed it with the end: it was rolled back alone (to its savepoint), **nothing
    /// was written for this run**, and its lease is still held. The other ends of the batch
    /// are not affected. Not a verdict on the lease: its holder ends it another way (the
    /// `Worker` counts a failed attempt).
    #[error("run {run}'s effect failed and was rolled back; its lease was not ended: {reason}")]
    EffectFailed {
        /// The run.
        run: RunId,
        /// What the effect's error said.
        reason: String,
    },
    /// The input was refused before reaching the store; nothing changed.
    #[error(transparent)]
    InvalidInput(#[from] InvalidInput),
    /// A signal refused: the run no longer waits in the wait its token names, or never did
    /// (see [`SignalRefusal`](crate::SignalRefusal)). Nothing was stored.
    #[error("signal for run {run} refused: {reason} (the run is {state})")]
    StaleSignal {
        /// The run.
        run: crate::RunId,
        /// Its state when the signal came.
        state: crate::RunState,
        /// Why.
        reason: crate::SignalRefusal,
    },
    /// The store could not be reached or did not answer in time. Retrying may succeed. A write
    /// that failed this way may or may not have been applied.
    #[error("{backend} backend unavailable: {detail}")]
    Unavailable {
        /// Which backend.
        backend: &'static str,
        /// The driver's error; its message is part of this error's (see [`Error::detail`]).
        detail: BoxError,
    },
    /// The store is set up so that its promises cannot be kept, or the adapter is pointed at it
    /// the wrong way: durability settings under which an acknowledged claim can be lost (a fence
    /// could be issued twice), a missing synchronous replica, a cluster reached through a plain
    /// URL, an unknown URL parameter. Retrying will not help until the setting is changed; a
    /// scope whose renewal meets it is cancelled at once. The message names the setting and the
    /// fix.
    #[error("{backend} backend is misconfigured: {detail}")]
    Misconfigured {
        /// Which backend.
        backend: &'static str,
        /// What is wrong and how to fix it; part of this error's message.
        detail: BoxError,
    },
    /// Any other backend failure (a broken schema, a protocol error). Retrying will not help.
    #[error("{backend} backend failed: {detail}")]
    Backend {
        /// Which backend.
        backend: &'static str,
        /// The driver's error; its message is part of this error's.
        detail: BoxError,
    },
}

impl Error {
    /// The driver's or adapter's error inside [`Error::Unavailable`], [`Error::Misconfigured`]
    /// or [`Error::Backend`], for downcasting; `None` for every other variant.
    ///
    /// Its message is already part of this error's `Display`, so it is deliberately **not**
    /// this error's [`source`](std::error::Error::source): an error chain (anyhow's `{:#}`,
    /// eyre's report) prints it once.
    ///
    /// ```
    /// use std::error::Error as _;
    /// let e = lease_core::Error::unavailable("postgres", "connection refused");
    /// assert_eq!(e.to_string(), "postgres backend unavailable: connection refused");
    /// assert!(e.source().is_none());
    /// assert_eq!(e.detail().map(|d| d.to_string()).as_deref(), Some("connection refused"));
    /// ```
    pub fn detail(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        match self {
            Error::Unavailable { detail, .. }
            | Error::Misconfigured { detail, .. }
            | Error::Backend { detail, .. } => Some(detail.as_ref()),
            _ => None,
        }
    }

    /// Whether retrying the same call may succeed: only [`Error::Unavailable`].
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Unavailable { .. })
    }

    /// Whether this is the store's verdict on the lease or run itself (fenced out, ended, gone),
    /// as opposed to a failure to reach a verdict ([`Error::Unavailable`], [`Error::Backend`])
    /// or a failed [effect](Error::EffectFailed), which leaves the lease held.
    pub fn is_verdict(&self) -> bool {
        !matches!(
            self,
            Error::Unavailable { .. }
                | Error::Backend { .. }
                | Error::Misconfigured { .. }
                | Error::EffectFailed { .. }
        )
    }

    /// Whether a lease that met this error on renewal must stop at once: a verdict, or a store
    /// that is [misconfigured](Error::Misconfigured) (it can no longer keep its promises, so
    /// waiting for the deadline would only keep the worker running on a lease nobody protects).
    pub fn ends_lease(&self) -> bool {
        self.is_verdict() || matches!(self, Error::Misconfigured { .. })
    }

    /// A stable, bounded name of the error's kind: `not_found`, `stale_fence`,
    /// `unavailable`, … What the metrics label errors by (`reason`), and what machine-readable
    /// output can match on; it never holds a run or worker id.
    pub fn code(&self) -> &'static str {
        match self {
            Error::NotFound { .. } => "not_found",
            Error::AlreadyExists { .. } => "already_exists",
            Error::Held { .. } => "held",
            Error::Suspended { .. } => "suspended",
            Error::Completed { .. } => "completed",
            Error::Failed { .. } => "failed",
            Error::Cancelled { .. } => "cancelled",
            Error::Delayed { .. } => "delayed",
            Error::NotSuspended { .. } => "not_suspended",
            Error::StaleSignal { .. } => "stale_signal",
            Error::StaleFence { .. } => "stale_fence",
            Error::LeaseEnded { .. } => "lease_ended",
            Error::FenceAhead { .. } => "fence_ahead",
            Error::FenceExhausted { .. } => "fence_exhausted",
            Error::AttemptsExhausted { .. } => "attempts_exhausted",
            Error::EffectFailed { .. } => "effect_failed",
            Error::InvalidInput(_) => "invalid_input",
            Error::Unavailable { .. } => "unavailable",
            Error::Misconfigured { .. } => "misconfigured",
            Error::Backend { .. } => "backend_error",
        }
    }

    /// A copy of this error, for reporting one verdict in two places (a scope's cancel reason
    /// and the caller's result, one error for every item of a failed batch). `Error` is not
    /// `Clone` because a driver's source error may not be: driver sources are carried over as
    /// their messages.
    pub fn duplicate(&self) -> Error {
        match self {
            Error::NotFound { run } => Error::NotFound { run: run.clone() },
            Error::AlreadyExists { run } => Error::AlreadyExists { run: run.clone() },
            Error::Held {
                run,
                owner,
                remaining,
            } => Error::Held {
                run: run.clone(),
                owner: owner.clone(),
                remaining: *remaining,
            },
            Error::Suspended { run } => Error::Suspended { run: run.clone() },
            Error::Completed { run } => Error::Completed { run: run.clone() },
            Error::Failed { run } => Error::Failed { run: run.clone() },
            Error::Cancelled { run } => Error::Cancelled { run: run.clone() },
            Error::Delayed { run, remaining } => Error::Delayed {
                run: run.clone(),
                remaining: *remaining,
            },
            Error::NotSuspended { run, state } => Error::NotSuspended {
                run: run.clone(),
                state: *state,
            },
            Error::StaleSignal { run, state, reason } => Error::StaleSignal {
                run: run.clone(),
                state: *state,
                reason: *reason,
            },
            Error::StaleFence {
                run,
                presented,
                current,
            } => Error::StaleFence {
                run: run.clone(),
                presented: *presented,
                current: *current,
            },
            Error::LeaseEnded { run, fence, ended } => Error::LeaseEnded {
                run: run.clone(),
                fence: *fence,
                ended: *ended,
            },
            Error::FenceAhead {
                run,
                presented,
                current,
            } => Error::FenceAhead {
                run: run.clone(),
                presented: *presented,
                current: *current,
            },
            Error::FenceExhausted { run } => Error::FenceExhausted { run: run.clone() },
            Error::AttemptsExhausted { run, attempts, max } => Error::AttemptsExhausted {
                run: run.clone(),
                attempts: *attempts,
                max: *max,
            },
            Error::EffectFailed { run, reason } => Error::EffectFailed {
                run: run.clone(),
                reason: reason.clone(),
            },
            Error::InvalidInput(e) => Error::InvalidInput(e.clone()),
            Error::Unavailable { backend, detail } => {
                Error::unavailable(backend, detail.to_string())
            }
            Error::Backend { backend, detail } => Error::backend(backend, detail.to_string()),
            Error::Misconfigured { backend, detail } => {
                Error::misconfigured(backend, detail.to_string())
            }
        }
    }

    /// An [`Error::Unavailable`] from `backend`.
    pub fn unavailable(backend: &'static str, source: impl Into<BoxError>) -> Error {
        Error::Unavailable {
            backend,
            detail: source.into(),
        }
    }

    /// An [`Error::Misconfigured`] from `backend`.
    pub fn misconfigured(backend: &'static str, source: impl Into<BoxError>) -> Error {
        Error::Misconfigured {
            backend,
            detail: source.into(),
        }
    }

    /// An [`Error::Backend`] from `backend`.
    pub fn backend(backend: &'static str, source: impl Into<BoxError>) -> Error {
        Error::Backend {
            backend,
            detail: source.into(),
        }
    }
}

/// How a lease ended at its holder's hand (or an operator's), as reported by
/// [`Error::LeaseEnded`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Ended {
    /// Released: the run is runnable and unowned.
    Released,
    /// Suspended: the run waits for `resume`.
    Suspended,
    /// Completed: terminal.
    Completed,
    /// Failed: given up on, until an operator resumes it.
    Failed,
    /// Cancelled ([`LeaseStore::cancel`](crate::LeaseStore::cancel)): ended for good by
    /// someone other than the holder, which is fenced out. Terminal.
    Cancelled,
}

impl fmt::Display for Ended {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Ended::Released => "released",
            Ended::Suspended => "suspended",
            Ended::Completed => "completed",
            Ended::Failed => "failed",
            Ended::Cancelled => "cancelled",
        })
    }
}

/// Input refused before it reached a store. Nothing was changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidInput {
    /// An empty run or worker id.
    #[error("{what} is empty; it must be 1 to 255 bytes of UTF-8")]
    EmptyId {
        /// `"run id"` or `"worker id"`.
        what: &'static str,
    },
    /// A run or worker id over 255 bytes.
    #[error("{what} is {len} bytes long; the limit is 255 bytes of UTF-8")]
    IdTooLong {
        /// `"run id"` or `"worker id"`.
        what: &'static str,
        /// Its length in bytes.
        len: usize,
    },
    /// An empty [`Kind`](crate::Kind).
    #[error("kind is empty; it must be 1 to {max} bytes of UTF-8")]
    EmptyKind {
        /// The limit.
        max: usize,
    },
    /// A [`Kind`](crate::Kind) over [`MAX_KIND_BYTES`](crate::MAX_KIND_BYTES).
    #[error("kind is {len} bytes long; the limit is {max} bytes of UTF-8")]
    KindTooLong {
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// An empty [`Queue`](crate::Queue).
    #[error("queue is empty; it must be 1 to {max} bytes of UTF-8")]
    EmptyQueue {
        /// The limit.
        max: usize,
    },
    /// A [`Queue`](crate::Queue) over [`MAX_QUEUE_BYTES`](crate::MAX_QUEUE_BYTES).
    #[error("queue is {len} bytes long; the limit is {max} bytes of UTF-8")]
    QueueTooLong {
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A priority over [`MAX_PRIORITY`](crate::MAX_PRIORITY)
    /// ([`NewRun::with_priority`](crate::NewRun::with_priority)).
    #[error("priority {priority} is too high; priorities are 0 to {max}, higher claimed first")]
    PriorityTooHigh {
        /// The priority asked for.
        priority: u8,
        /// The highest priority.
        max: u8,
    },
    /// A run or worker id containing a control character.
    #[error("{what} contains a control character at byte {at}; ids must be printable")]
    ControlCharacter {
        /// `"run id"` or `"worker id"`.
        what: &'static str,
        /// Byte offset of the first control character.
        at: usize,
    },
    /// A TTL under 1 ms.
    #[error("TTL {ttl:?} is too short; the minimum is 1ms")]
    TtlTooShort {
        /// The TTL asked for.
        ttl: Duration,
    },
    /// A TTL shorter than the backend can time: etcd times its leases in whole seconds, with
    /// a floor of one second.
    #[error("TTL {ttl:?} is shorter than the {backend} backend's minimum of {min:?}")]
    TtlUnderBackendMinimum {
        /// The TTL asked for.
        ttl: Duration,
        /// The backend's shortest TTL.
        min: Duration,
        /// Which backend.
        backend: &'static str,
    },
    /// A TTL over [`Ttl::MAX`](crate::Ttl::MAX).
    #[error("TTL {ttl:?} is longer than the maximum of {max:?}")]
    TtlTooLong {
        /// The TTL asked for.
        ttl: Duration,
        /// The maximum.
        max: Duration,
    },
    /// A lease with fence 0, which no claim issues.
    #[error("fence 0 is never issued by a claim; this lease was not produced by a store")]
    FenceZero,
    /// A fence above [`Fence::MAX`](crate::Fence::MAX).
    #[error("fence {fence} is out of range; the maximum is {}", i64::MAX)]
    FenceOutOfRange {
        /// The fence given.
        fence: u64,
    },
    /// `claim_next` with `max` of 0.
    #[error("claim_next needs max of at least 1")]
    BatchEmpty,
    /// A batch over [`MAX_BATCH`](crate::MAX_BATCH).
    #[error("batch of {len} is larger than the maximum of {max}")]
    BatchTooLarge {
        /// The size asked for.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// A journal payload over [`MAX_PAYLOAD_BYTES`](crate::MAX_PAYLOAD_BYTES).
    #[error("journal payload of {len} bytes is larger than the maximum of {max}")]
    PayloadTooLarge {
        /// The payload's size.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// An [`end_many`](crate::LeaseStore::end_many) batch whose effects together exceed
    /// [`MAX_BATCH_PAYLOAD_BYTES`](crate::MAX_BATCH_PAYLOAD_BYTES).
    #[error(
        "a batch carrying {len} bytes of effects is larger than the maximum of {max}; split it"
    )]
    BatchPayloadTooLarge {
        /// The batch's payload bytes.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// A list limit of 0 or over [`MAX_LIST`](crate::MAX_LIST).
    #[error("list limit {limit} is out of range; it must be 1 to {max}")]
    ListLimit {
        /// The limit asked for.
        limit: usize,
        /// The maximum.
        max: usize,
    },
    /// A `RunScope` (`lease-runtime`) whose heartbeat does not fit inside its deadline window.
    #[error(
        "heartbeat every {heartbeat:?} does not fit a TTL of {ttl:?} with a safety margin of \
         {margin:?}: a renewal, its timeout (one interval) and a retry (a quarter interval) \
         must fit before the local deadline, so 2.25 x heartbeat must be below TTL minus margin"
    )]
    ScopeTiming {
        /// The lease's TTL.
        ttl: Duration,
        /// The heartbeat interval asked for.
        heartbeat: Duration,
        /// The safety margin asked for.
        margin: Duration,
    },
    /// The same run twice in one batch of [`end_many`](crate::LeaseStore::end_many).
    #[error("run {run} appears twice in one batch; end each lease once per batch")]
    DuplicateRun {
        /// The repeated run id.
        run: crate::RunId,
    },
    /// A worker runtime setting out of range.
    #[error("worker setting {setting} is {value}; {rule}")]
    WorkerSetting {
        /// The setting's name.
        setting: &'static str,
        /// The value given.
        value: String,
        /// The rule it breaks.
        rule: &'static str,
    },
    /// An [`Effect`](crate::Effect) the store cannot apply (another backend's), or effects
    /// that do not match the ends they go with.
    #[error("effects refused: {why}")]
    Effects {
        /// What is wrong.
        why: &'static str,
    },
    /// A `RunScope` (`lease-runtime`) safety margin below `min_margin`.
    #[error(
        "safety margin {margin:?} is too small for a TTL of {ttl:?}; the minimum is {min:?} \
         (TTL/20, at least 10ms): below it timer lateness can carry the worker past the store's \
         expiry"
    )]
    MarginTooSmall {
        /// The lease's TTL.
        ttl: Duration,
        /// The margin asked for.
        margin: Duration,
        /// The minimum for this TTL.
        min: Duration,
    },
    /// [`End::Committed`](crate::End::Committed) given to a store: it reports an end the caller
    /// already committed, and is for the `Worker` only.
    #[error(
        "the end of run {run} is marked as already committed by its handler; a store writes \
         only complete, complete-with, release and suspend"
    )]
    AlreadyCommitted {
        /// The run.
        run: crate::RunId,
    },
    /// A job's arguments (`lease-runtime`'s `JobArgs`) that cannot be written as JSON (a map
    /// with keys that are not strings, a `Serialize` impl that fails).
    #[error("the arguments of a {kind} job cannot be written as JSON: {why}")]
    JobArgs {
        /// The job's kind.
        kind: String,
        /// What the encoder said.
        why: String,
    },
    /// An empty [`SignalName`](crate::SignalName).
    #[error("signal name is empty; it must be 1 to {max} bytes of UTF-8")]
    EmptySignalName {
        /// The limit.
        max: usize,
    },
    /// A [`SignalName`](crate::SignalName) over [`MAX_SIGNAL_BYTES`](crate::MAX_SIGNAL_BYTES).
    #[error("signal name is {len} bytes long; the limit is {max} bytes of UTF-8")]
    SignalNameTooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A wait's timeout that is zero, not whole milliseconds, or over
    /// [`MAX_WAIT`](crate::MAX_WAIT).
    #[error("wait timeout {timeout:?} is out of range; it must be 1 ms to {max:?}, in whole milliseconds")]
    WaitTimeout {
        /// The timeout asked for.
        timeout: std::time::Duration,
        /// The limit.
        max: std::time::Duration,
    },
    /// A signal's payload over [`MAX_SIGNAL_PAYLOAD_BYTES`](crate::MAX_SIGNAL_PAYLOAD_BYTES).
    #[error("signal payload of {len} bytes is over the maximum of {max} bytes")]
    SignalPayloadTooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A [`SignalToken`](crate::SignalToken) that is malformed, or whose signature the store's
    /// key does not accept.
    #[error("signal token refused: {why}")]
    SignalToken {
        /// What is wrong with it.
        why: &'static str,
    },
    /// A [`TraceParent`](crate::TraceParent) that is not a W3C `traceparent` of version 00.
    #[error("trace parent refused: {why}")]
    TraceParent {
        /// What is wrong with it.
        why: &'static str,
    },
    /// A [`SignalKey`](crate::SignalKey) secret too short or too long.
    #[error("signal key secret is {len} bytes; it must be {min} to {max} bytes")]
    SignalKey {
        /// Its length.
        len: usize,
        /// The shortest allowed.
        min: usize,
        /// The longest allowed.
        max: usize,
    },
    /// An operation this backend does not offer (a method added to the trait after it was
    /// written, whose default refuses rather than weakens the contract).
    #[error("{operation} is not supported by this backend")]
    Unsupported {
        /// The operation.
        operation: &'static str,
    },
    /// An [`End::RetryAfter`](crate::End::RetryAfter) delay over
    /// [`MAX_RETRY_DELAY`](crate::MAX_RETRY_DELAY).
    #[error("retry delay {delay:?} is longer than the maximum of {max:?}")]
    RetryDelayTooLong {
        /// The delay asked for.
        delay: Duration,
        /// The maximum.
        max: Duration,
    },
    /// A [`NewRun`](crate::NewRun) delay over
    /// [`MAX_START_DELAY`](crate::MAX_START_DELAY).
    #[error("start delay {delay:?} is longer than the maximum of {max:?}")]
    StartDelayTooLong {
        /// The delay asked for.
        delay: Duration,
        /// The maximum.
        max: Duration,
    },
    /// A [`NewRun::with_run_at`](crate::NewRun::with_run_at) time further ahead than
    /// [`MAX_START_DELAY`](crate::MAX_START_DELAY).
    #[error("run_at is {ahead:?} ahead; the maximum is {max:?}")]
    RunAtTooFar {
        /// How far ahead of this process's clock it is, in whole seconds.
        ahead: Duration,
        /// The maximum.
        max: Duration,
    },
    /// A `Schedule` or `Scheduler` (`lease-runtime`) setting that cannot
    /// work: an interval that is not a whole number of seconds, a cron expression that does
    /// not parse, a name too long for its tick ids.
    #[error("bad schedule: {reason}")]
    Schedule {
        /// Why.
        reason: String,
    },
    /// A run's payload ([`NewRun::with_payload`](crate::NewRun::with_payload)) over
    /// [`MAX_RUN_PAYLOAD_BYTES`](crate::MAX_RUN_PAYLOAD_BYTES).
    #[error("run payload of {len} bytes is over the maximum of {max} bytes")]
    RunPayloadTooLarge {
        /// The payload's size.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// An [`End::Fail`](crate::End::Fail) reason over
    /// [`MAX_REASON_BYTES`](crate::MAX_REASON_BYTES).
    #[error("failure reason of {len} bytes is longer than the maximum of {max}")]
    ReasonTooLong {
        /// The reason's size.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// An [`End::Fail`](crate::End::Fail) reason holding a control character other than a
    /// tab or a line feed (a NUL, which Postgres cannot store, or a terminal escape).
    #[error(
        "failure reason contains the control character U+{code:04X} at byte {at}; a reason may \
         hold tabs and line feeds but no other control character (lease_core::sanitize_reason \
         escapes them)"
    )]
    ReasonControlCharacter {
        /// Byte offset of the first such character.
        at: usize,
        /// Its code point.
        code: u32,
    },
    /// A [`purge`](crate::LeaseStore::purge) age over [`MAX_PURGE_AGE`](crate::MAX_PURGE_AGE).
    #[error("purge age {age:?} is longer than the maximum of {max:?}")]
    PurgeAgeTooLong {
        /// The age asked for.
        age: Duration,
        /// The maximum.
        max: Duration,
    },
    /// A state name other than `runnable`, `suspended`, `completed` or `failed`.
    #[error("unknown run state {state:?}; expected runnable, suspended, completed or failed")]
    UnknownState {
        /// The name given (first 32 characters).
        state: String,
    },
    /// An attempt outcome name other than those of
    /// [`AttemptOutcome`](crate::AttemptOutcome) (a store's history written by a newer release,
    /// or damaged).
    #[error("unknown attempt outcome {outcome:?}")]
    UnknownOutcome {
        /// The name found (first 32 characters).
        outcome: String,
    },
}
