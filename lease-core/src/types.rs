//! The values that cross the `LeaseStore` boundary: fences, TTLs, leases, records, journal entries.

use crate::limits::{
    MAX_BATCH, MAX_BATCH_PAYLOAD_BYTES, MAX_LIST, MAX_PAYLOAD_BYTES, MAX_PURGE_AGE,
    MAX_REASON_BYTES, MAX_RETRY_DELAY,
};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use crate::error::InvalidInput;
use crate::id::{RunId, WorkerId};
use crate::kind::Kind;
use crate::queue::Queue;

mod checks;
mod end;
mod record;

pub use checks::*;
pub use end::*;
pub use record::*;

/// A run's fencing token: 0 before the first claim, +1 on every successful claim, never
/// decreasing and never repeating.
///
/// Fences are compared as integers inside the store; they are never derived from a clock.
/// The largest fence is [`Fence::MAX`] (`i64::MAX`), so every backend stores it losslessly in a
/// signed 64-bit column or Redis integer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Fence(u64);

impl Fence {
    /// The fence of a run that has never been claimed.
    pub const ZERO: Fence = Fence(0);
    /// The largest fence any backend issues; a claim past it fails with
    /// [`Error::FenceExhausted`](crate::Error::FenceExhausted).
    pub const MAX: Fence = Fence(i64::MAX as u64);

    /// Wraps a fence value read from a store or a lease.
    ///
    /// # Errors
    /// [`InvalidInput::FenceOutOfRange`] above [`Fence::MAX`].
    pub fn new(value: u64) -> Result<Fence, InvalidInput> {
        if value > Self::MAX.0 {
            return Err(InvalidInput::FenceOutOfRange { fence: value });
        }
        Ok(Fence(value))
    }

    /// The fence as an integer.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<Fence> for u64 {
    fn from(fence: Fence) -> u64 {
        fence.0
    }
}

/// A lease's time to live, at millisecond precision, from 1 ms to [`Ttl::MAX`] (one day).
///
/// ```
/// use std::time::Duration;
/// use lease_core::{InvalidInput, Ttl};
/// assert_eq!(Ttl::from_millis(1500).unwrap().as_duration(), Duration::from_millis(1500));
/// assert!(matches!(Ttl::new(Duration::ZERO), Err(InvalidInput::TtlTooShort { .. })));
/// assert!(matches!(Ttl::from_secs(2 * 86_400), Err(InvalidInput::TtlTooLong { .. })));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ttl(u64);

impl Ttl {
    /// The longest TTL accepted: one day. A longer lease is almost always a unit mistake.
    pub const MAX: Duration = Duration::from_secs(86_400);

    /// A TTL of `duration`, truncated to whole milliseconds.
    ///
    /// # Errors
    /// [`InvalidInput::TtlTooShort`] below 1 ms, [`InvalidInput::TtlTooLong`] above [`Ttl::MAX`].
    pub fn new(duration: Duration) -> Result<Ttl, InvalidInput> {
        if duration > Self::MAX {
            return Err(InvalidInput::TtlTooLong {
                ttl: duration,
                max: Self::MAX,
            });
        }
        let millis = duration.as_millis() as u64; // at most 86_400_000, checked above
        if millis == 0 {
            return Err(InvalidInput::TtlTooShort { ttl: duration });
        }
        Ok(Ttl(millis))
    }

    /// A TTL of `millis` milliseconds. See [`Ttl::new`].
    ///
    /// # Errors
    /// As [`Ttl::new`].
    pub fn from_millis(millis: u64) -> Result<Ttl, InvalidInput> {
        Self::new(Duration::from_millis(millis))
    }

    /// A TTL of `secs` seconds. See [`Ttl::new`].
    ///
    /// # Errors
    /// As [`Ttl::new`].
    pub fn from_secs(secs: u64) -> Result<Ttl, InvalidInput> {
        Self::new(Duration::from_secs(secs))
    }

    /// The TTL in milliseconds.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// The TTL as a [`Duration`].
    pub const fn as_duration(self) -> Duration {
        Duration::from_millis(self.0)
    }
}

impl fmt::Display for Ttl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

/// An instant on the **store's** clock, in microseconds.
///
/// Postgres and Redis count from the Unix epoch on the server; the memory store counts from its
/// own creation on the monotonic clock. Only differences between two `StoreTime`s of the same
/// store are meaningful to a worker; a worker never compares them with its own clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct StoreTime(u64);

impl StoreTime {
    /// The instant `micros` microseconds after the store clock's origin.
    pub const fn from_micros(micros: u64) -> StoreTime {
        StoreTime(micros)
    }

    /// Microseconds since the store clock's origin.
    pub const fn as_micros(self) -> u64 {
        self.0
    }

    /// How long from `earlier` to `self`, or zero if `earlier` is later.
    pub fn saturating_since(self, earlier: StoreTime) -> Duration {
        Duration::from_micros(self.0.saturating_sub(earlier.0))
    }
}

impl fmt::Display for StoreTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:06}s", self.0 / 1_000_000, self.0 % 1_000_000)
    }
}

/// Where a run is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RunState {
    /// May be claimed when unowned or when its lease has expired.
    Runnable,
    /// Waiting on something outside the engine; not claimable until resumed.
    Suspended,
    /// Finished; terminal.
    Completed,
    /// Given up on ([`End::Fail`]), with a reason: never claimable, until an operator puts it
    /// back with [`resume`](crate::LeaseStore::resume), after which its next claim takes a
    /// higher fence as always.
    Failed,
    /// Ended for good by [`cancel`](crate::LeaseStore::cancel), with a reason, whatever state
    /// it was in: never claimable again, and a holder it had is fenced out
    /// ([`Ended::Cancelled`](crate::Ended::Cancelled)). Terminal.
    Cancelled,
}

impl RunState {
    /// Every state, in the order of their names in output.
    pub const ALL: [RunState; 5] = [
        RunState::Runnable,
        RunState::Suspended,
        RunState::Completed,
        RunState::Failed,
        RunState::Cancelled,
    ];

    /// The lower-case name used in storage and output: `runnable`, `suspended`, `completed`,
    /// `failed`, `cancelled`.
    pub const fn as_str(self) -> &'static str {
        match self {
            RunState::Runnable => "runnable",
            RunState::Suspended => "suspended",
            RunState::Completed => "completed",
            RunState::Failed => "failed",
            RunState::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for RunState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RunState {
    type Err = InvalidInput;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "runnable" => Ok(RunState::Runnable),
            "suspended" => Ok(RunState::Suspended),
            "completed" => Ok(RunState::Completed),
            "failed" => Ok(RunState::Failed),
            "cancelled" => Ok(RunState::Cancelled),
            other => Err(InvalidInput::UnknownState {
                state: other.chars().take(32).collect(),
            }),
        }
    }
}

/// A claim on a run: the proof a worker presents, by its fence, on every write.
///
/// A `Lease` is plain data. Holding one grants nothing by itself: the store accepts a write only
/// while the lease's fence equals the run's stored fence and the lease has not been released,
/// suspended, completed or failed.
#[derive(Clone, PartialEq, Eq)]
pub struct Lease {
    run: RunId,
    owner: WorkerId,
    fence: Fence,
    ttl: Ttl,
    expires_at: StoreTime,
    attempt: u64,
    payload: Option<Arc<[u8]>>,
    kind: Kind,
    queue: Queue,
    priority: u8,
    waited: Option<Duration>,
    resumed: Option<Arc<crate::WaitEnd>>,
    trace_parent: Option<crate::TraceParent>,
}

impl Lease {
    /// Assembles a lease, as a backend does from its store's answer.
    ///
    /// # Errors
    /// [`InvalidInput::FenceZero`]: fence 0 is never issued by a claim.
    pub fn new(
        run: RunId,
        owner: WorkerId,
        fence: Fence,
        ttl: Ttl,
        expires_at: StoreTime,
    ) -> Result<Lease, InvalidInput> {
        if fence == Fence::ZERO {
            return Err(InvalidInput::FenceZero);
        }
        Ok(Lease {
            run,
            owner,
            fence,
            ttl,
            expires_at,
            attempt: fence.get(),
            payload: None,
            kind: Kind::default(),
            queue: Queue::default(),
            priority: 0,
            waited: None,
            resumed: None,
            trace_parent: None,
        })
    }

    /// The same lease, of its run's trace context
    /// ([`NewRun::with_trace_parent`](crate::NewRun::with_trace_parent)), as a backend's
    /// claims set it.
    pub fn with_trace_parent(mut self, parent: Option<crate::TraceParent>) -> Lease {
        self.trace_parent = parent;
        self
    }

    /// The trace context the run was created under: the `Worker`'s span for the attempt
    /// continues it (its parent, with the `otel` feature). `None` for a run created without
    /// one. Fixed for the run's life.
    pub fn trace_parent(&self) -> Option<&crate::TraceParent> {
        self.trace_parent.as_ref()
    }

    /// The same lease, saying how long its run had been claimable when the claim took it (see
    /// [`Lease::waited`]).
    pub fn with_waited(mut self, waited: Option<Duration>) -> Lease {
        self.waited = waited;
        self
    }

    /// How long the run had been claimable when this lease's claim took it, on the store's
    /// clock: since its creation, the end of its delay, its release, or the expiry of the lease
    /// before. What the `Worker` reports as
    /// `WORKER_WAIT`. Set by the claims of the backends that
    /// know it ([`claim_next`](crate::LeaseStore::claim_next) on every backend of this
    /// workspace); `None` otherwise. Kept by renewals.
    pub fn waited(&self) -> Option<Duration> {
        self.waited
    }

    /// The same lease, of its run's priority ([`NewRun::with_priority`](crate::NewRun::with_priority)),
    /// as a backend sets it on the leases its claims hand out.
    pub fn with_priority(mut self, priority: u8) -> Lease {
        self.priority = priority;
        self
    }

    /// The run's priority: 0 for a run created without one. Fixed for the run's life.
    pub fn priority(&self) -> u8 {
        self.priority
    }

    /// The same lease, of its run's kind ([`NewRun::with_kind`](crate::NewRun::with_kind)),
    /// as a backend sets it on the leases its claims hand out.
    pub fn with_kind(mut self, kind: Kind) -> Lease {
        self.kind = kind;
        self
    }

    /// The run's kind: the [`DEFAULT_KIND`](crate::DEFAULT_KIND) for a run created without
    /// one. Fixed for the run's life.
    pub fn kind(&self) -> &Kind {
        &self.kind
    }

    /// The same lease, saying how its run's last wait ended, as a backend's claims set it.
    pub fn with_resumed(mut self, resumed: Option<crate::WaitEnd>) -> Lease {
        self.resumed = resumed.map(Arc::new);
        self
    }

    /// How the run's last wait ([`End::await_signal`](crate::End::await_signal)) ended: the
    /// signal that answered it, or its timeout. Carried by every lease of the run from the
    /// claim that resumed it until it waits again; `None` for a run that never waited (or was
    /// resumed by an operator).
    pub fn resumed(&self) -> Option<&crate::WaitEnd> {
        self.resumed.as_deref()
    }

    /// The same lease, of its run's queue ([`NewRun::with_queue`](crate::NewRun::with_queue)),
    /// as a backend sets it on the leases its claims hand out.
    pub fn with_queue(mut self, queue: Queue) -> Lease {
        self.queue = queue;
        self
    }

    /// The run's queue: the [`DEFAULT_QUEUE`](crate::DEFAULT_QUEUE) for a run created without
    /// one. Fixed for the run's life.
    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    /// The same lease, carrying what `from` (a lease of the same run) says of the run itself:
    /// its payload, kind and priority, which never change, and how long the claim found it
    /// waiting. A backend's renewal builds its new
    /// lease from the store's answer and carries these from the lease it renewed.
    pub fn carrying(mut self, from: &Lease) -> Lease {
        self.payload = from.payload.clone();
        self.kind = from.kind.clone();
        self.queue = from.queue.clone();
        self.priority = from.priority;
        self.waited = from.waited;
        self.resumed = from.resumed.clone();
        self.trace_parent = from.trace_parent.clone();
        self
    }

    /// The same lease, carrying its run's payload ([`NewRun::with_payload`](crate::NewRun::with_payload)),
    /// as a backend sets it on the leases its claims hand out and its renewals hand back.
    pub fn with_payload(mut self, payload: Option<Arc<[u8]>>) -> Lease {
        self.payload = payload;
        self
    }

    /// The run's payload, as the claim read it with the record: `None` for a run created
    /// without one. Immutable for the run's life, so a renewal's lease carries the same.
    pub fn payload(&self) -> Option<&[u8]> {
        self.payload.as_deref()
    }

    /// The payload, shared (cheap to clone).
    pub fn payload_shared(&self) -> Option<Arc<[u8]>> {
        self.payload.clone()
    }

    /// The same lease, as attempt `attempt` of its run's budget: the run's attempt counter
    /// after the claim that produced it ([`RunRecord::attempts`]). A backend that keeps the
    /// counter sets it on every lease it hands out; without it the attempt is the fence, which
    /// counts every claim.
    pub fn with_attempt(mut self, attempt: u64) -> Lease {
        self.attempt = attempt;
        self
    }

    /// The claimed run.
    pub fn run(&self) -> &RunId {
        &self.run
    }

    /// The worker that claimed it.
    pub fn owner(&self) -> &WorkerId {
        &self.owner
    }

    /// The fence this lease writes under.
    pub fn fence(&self) -> Fence {
        self.fence
    }

    /// The TTL each claim or renewal extends the lease by.
    pub fn ttl(&self) -> Ttl {
        self.ttl
    }

    /// The lease's expiry on the store's clock, as of the claim or renewal that produced it.
    pub fn expires_at(&self) -> StoreTime {
        self.expires_at
    }

    /// Which attempt of the run's budget this lease is: 1 for the first claim after the run
    /// was created or resumed, raised by every claim and given back by a voluntary end
    /// (release, suspend, a snooze), so a claim whose holder failed, timed out or vanished
    /// counts and the others do not. A `Worker` fails a run claimed past its
    /// `RetryPolicy`'s `max_attempts` without running its handler.
    pub fn attempt(&self) -> u64 {
        self.attempt
    }
}

/// A payload in `Debug` output: its size, never its bytes (they are the user's data, which
/// logs must not carry).
pub(crate) struct PayloadSize(pub(crate) Option<usize>);

impl fmt::Debug for PayloadSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(len) => write!(f, "{len} bytes"),
            None => f.write_str("None"),
        }
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("run", &self.run)
            .field("owner", &self.owner)
            .field("fence", &self.fence)
            .field("ttl", &self.ttl)
            .field("expires_at", &self.expires_at)
            .field("attempt", &self.attempt)
            .field("kind", &self.kind)
            .field("queue", &self.queue)
            .field("priority", &self.priority)
            .field("waited", &self.waited)
            .field("trace_parent", &self.trace_parent)
            .field(
                "payload",
                &PayloadSize(self.payload.as_ref().map(|p| p.len())),
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_truncates_to_millis_and_refuses_extremes() {
        assert_eq!(
            Ttl::new(Duration::from_micros(1_999)).unwrap().as_millis(),
            1
        );
        assert!(matches!(
            Ttl::new(Duration::from_micros(999)),
            Err(InvalidInput::TtlTooShort { .. })
        ));
        assert!(Ttl::new(Ttl::MAX).is_ok());
        assert!(matches!(
            Ttl::new(Ttl::MAX + Duration::from_millis(1)),
            Err(InvalidInput::TtlTooLong { .. })
        ));
    }

    #[test]
    fn fence_range_is_that_of_a_signed_64_bit_column() {
        assert_eq!(Fence::new(i64::MAX as u64).unwrap(), Fence::MAX);
        assert_eq!(
            Fence::new(i64::MAX as u64 + 1).unwrap_err(),
            InvalidInput::FenceOutOfRange {
                fence: i64::MAX as u64 + 1
            }
        );
        assert_eq!(Fence::new(7).unwrap().to_string(), "7");
    }

    #[test]
    fn a_lease_never_carries_fence_zero() {
        let run = RunId::new("r").unwrap();
        let owner = WorkerId::new("w").unwrap();
        let ttl = Ttl::from_millis(10).unwrap();
        assert_eq!(
            Lease::new(run, owner, Fence::ZERO, ttl, StoreTime::default()).unwrap_err(),
            InvalidInput::FenceZero
        );
    }

    #[test]
    fn state_names_round_trip() {
        for state in RunState::ALL {
            assert_eq!(state.as_str().parse::<RunState>().unwrap(), state);
        }
        assert!(matches!(
            "paused".parse::<RunState>(),
            Err(InvalidInput::UnknownState { .. })
        ));
    }
}
