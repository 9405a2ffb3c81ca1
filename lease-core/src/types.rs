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
    priority: u8,
    waited: Option<Duration>,
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
            priority: 0,
            waited: None,
        })
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

    /// The same lease, carrying what `from` (a lease of the same run) says of the run itself:
    /// its payload, kind and priority, which never change, and how long the claim found it
    /// waiting. A backend's renewal builds its new
    /// lease from the store's answer and carries these from the lease it renewed.
    pub fn carrying(mut self, from: &Lease) -> Lease {
        self.payload = from.payload.clone();
        self.kind = from.kind.clone();
        self.priority = from.priority;
        self.waited = from.waited;
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
            .field("priority", &self.priority)
            .field("waited", &self.waited)
            .field(
                "payload",
                &PayloadSize(self.payload.as_ref().map(|p| p.len())),
            )
            .finish()
    }
}

/// A run's times on the store's clock, as a backend reads them with its record (see
/// [`RunRecord::with_times`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunTimes {
    /// See [`RunRecord::created_at`].
    pub created_at: Option<StoreTime>,
    /// See [`RunRecord::claimed_at`].
    pub claimed_at: Option<StoreTime>,
    /// See [`RunRecord::renewed_at`].
    pub renewed_at: Option<StoreTime>,
    /// See [`RunRecord::ended_at`].
    pub ended_at: Option<StoreTime>,
}

/// A run's record as the store holds it, read at [`RunRecord::observed_at`].
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunRecord {
    /// The run.
    pub run: RunId,
    /// Its state.
    pub state: RunState,
    /// The worker holding the lease, if any (possibly expired: see [`RunRecord::is_expired`]).
    pub owner: Option<WorkerId>,
    /// When the lease expires on the store's clock, if owned.
    pub expires_at: Option<StoreTime>,
    /// The current fence: the fence of the latest claim, 0 if never claimed.
    pub fence: Fence,
    /// How many renewals have succeeded over the run's life.
    pub heartbeats: u64,
    /// For a runnable, unowned run given back with [`End::RetryAfter`]: the instant on the
    /// store's clock before which no claim takes it, if that is still ahead of
    /// [`observed_at`](RunRecord::observed_at). `None` once it has passed, and for every other
    /// run.
    pub not_before: Option<StoreTime>,
    /// For a [failed](RunState::Failed) run: the reason its last holder gave
    /// ([`End::Fail`]); for a [cancelled](RunState::Cancelled) one, the reason given to
    /// [`cancel`](crate::LeaseStore::cancel). `None` for every other run.
    pub failure: Option<String>,
    /// The attempt budget's counter: claims since the run was created or last resumed, less
    /// those that ended voluntarily ([`End::Release`], [`End::Suspend`],
    /// [`End::RetryAfter`]). A claim whose holder failed ([`End::AttemptFailed`],
    /// [`End::Fail`]), timed out or vanished (its lease expired, its process crashed) counts.
    /// Distinct from the fence, which counts every claim and never goes back.
    pub attempts: u64,
    /// The run's payload ([`NewRun::with_payload`](crate::NewRun::with_payload)), byte-exact;
    /// `None` for a run created without one. Read by [`inspect`](crate::LeaseStore::inspect),
    /// [`inspect_many`](crate::LeaseStore::inspect_many) and the creates; the other calls
    /// that return records ([`list`](crate::LeaseStore::list), cancel, resume,
    /// force-release) leave it `None` so that their work stays small.
    pub payload: Option<Vec<u8>>,
    /// The run's kind ([`NewRun::with_kind`](crate::NewRun::with_kind)): the
    /// [`DEFAULT_KIND`](crate::DEFAULT_KIND) for a run created without one.
    pub kind: Kind,
    /// The run's priority ([`NewRun::with_priority`](crate::NewRun::with_priority)): 0 for a
    /// run created without one.
    pub priority: u8,
    /// When the run was created (or created again after a purge), on the store's clock.
    /// `None` where the store does not know: a run created before its backend kept times (a
    /// Postgres schema migrated from an earlier release), or a backend that keeps none (see
    /// [`RunRecord::times_kept`]).
    pub created_at: Option<StoreTime>,
    /// When the run's latest claim took it, on the store's clock; `None` if it was never
    /// claimed (since it was created). Kept after the lease ends: with
    /// [`ended_at`](RunRecord::ended_at) it tells how long the last attempt ran.
    pub claimed_at: Option<StoreTime>,
    /// When the latest claim's lease was last renewed, on the store's clock; `None` if that
    /// lease was never renewed (or the run never claimed). A claim clears it.
    pub renewed_at: Option<StoreTime>,
    /// When the run ended ([completed](RunState::Completed), [failed](RunState::Failed) or
    /// [cancelled](RunState::Cancelled)), on the store's clock: the instant retention's age
    /// counts from. `None` for a run that has not ended; a resume clears it.
    pub ended_at: Option<StoreTime>,
    /// The run's last attempts, oldest first, at most [`MAX_HISTORY`](crate::MAX_HISTORY),
    /// the latest claim included ([`RunRecord::with_history`]). Read by
    /// [`inspect`](crate::LeaseStore::inspect) from a backend that keeps it; `None` from a
    /// backend that keeps none, and from the calls that return many records or a record
    /// after a write ([`list`](crate::LeaseStore::list), cancel, resume, force-release).
    pub history: Option<Vec<crate::Attempt>>,
    /// For a runnable, unowned run that a claim could take when the record was read: the
    /// instant on the store's clock it became claimable (its creation, the end of its delay or
    /// retry delay, its release, resume or force-release). `None` for every other run (a
    /// held run; an expired lease, which waits since its
    /// [`expires_at`](RunRecord::expires_at): see [`RunRecord::waiting_for`]; a delayed run),
    /// and where the store cannot tell (etcd, which times no instants of its own; a Redis run
    /// last given back by a release before this field was kept).
    pub claimable_since: Option<StoreTime>,
    /// The store's clock when this record was read.
    pub observed_at: StoreTime,
}

impl RunRecord {
    /// A record of `run` in `state` at `fence`, read at `observed_at` on the store's clock:
    /// unowned, no heartbeats, no retry delay, no failure. Backends build their records from
    /// it with the `with_*` setters.
    ///
    /// ```
    /// use lease_core::{Fence, RunId, RunRecord, RunState, StoreTime, WorkerId};
    /// let now = StoreTime::from_micros(5_000_000);
    /// let record = RunRecord::new(RunId::new("order-7")?, RunState::Runnable, Fence::new(3)?, now)
    ///     .with_lease(WorkerId::new("w1")?, StoreTime::from_micros(6_000_000))
    ///     .with_heartbeats(2);
    /// assert_eq!(record.remaining(), Some(std::time::Duration::from_secs(1)));
    /// # Ok::<(), lease_core::InvalidInput>(())
    /// ```
    pub fn new(run: RunId, state: RunState, fence: Fence, observed_at: StoreTime) -> RunRecord {
        RunRecord {
            run,
            state,
            owner: None,
            expires_at: None,
            fence,
            heartbeats: 0,
            not_before: None,
            failure: None,
            attempts: 0,
            payload: None,
            kind: Kind::default(),
            priority: 0,
            created_at: None,
            claimed_at: None,
            renewed_at: None,
            ended_at: None,
            history: None,
            claimable_since: None,
            observed_at,
        }
    }

    /// Claimable since `at` (see [`RunRecord::claimable_since`]).
    pub fn with_claimable_since(mut self, at: Option<StoreTime>) -> RunRecord {
        self.claimable_since = at;
        self
    }

    /// How long the run had waited to be claimed when the record was read, on the store's
    /// clock: since [`claimable_since`](RunRecord::claimable_since) for an unowned run, since
    /// its lease's expiry for a run whose lease expired. `None` for a run no claim could take
    /// (held, delayed, not runnable) and when the store cannot tell.
    ///
    /// ```
    /// use lease_core::{Fence, RunId, RunRecord, RunState, StoreTime, WorkerId};
    /// let at = StoreTime::from_micros;
    /// let released = RunRecord::new(RunId::new("r")?, RunState::Runnable, Fence::new(1)?, at(70_000_000))
    ///     .with_claimable_since(Some(at(10_000_000)));
    /// assert_eq!(released.waiting_for(), Some(std::time::Duration::from_secs(60)));
    /// let expired = RunRecord::new(RunId::new("r")?, RunState::Runnable, Fence::new(1)?, at(70_000_000))
    ///     .with_lease(WorkerId::new("w1")?, at(40_000_000));
    /// assert_eq!(expired.waiting_for(), Some(std::time::Duration::from_secs(30)));
    /// # Ok::<(), lease_core::InvalidInput>(())
    /// ```
    pub fn waiting_for(&self) -> Option<Duration> {
        if self.state != RunState::Runnable || self.fence >= Fence::MAX {
            return None;
        }
        let since = if self.owner.is_some() {
            self.expires_at?
        } else if self.not_before.is_some() {
            return None;
        } else {
            self.claimable_since?
        };
        (since <= self.observed_at).then(|| self.observed_at.saturating_since(since))
    }

    /// With its times (see [`RunRecord::created_at`], [`claimed_at`](RunRecord::claimed_at),
    /// [`renewed_at`](RunRecord::renewed_at) and [`ended_at`](RunRecord::ended_at)).
    pub fn with_times(mut self, times: RunTimes) -> RunRecord {
        self.created_at = times.created_at;
        self.claimed_at = times.claimed_at;
        self.renewed_at = times.renewed_at;
        self.ended_at = times.ended_at;
        self
    }

    /// Whether the record carries the store's times: a backend that keeps them always sets
    /// [`created_at`](RunRecord::created_at) for a run created since it did.
    pub fn times_kept(&self) -> bool {
        self.created_at.is_some()
    }

    /// How long the current holder has held the run, on the store's clock, when the record
    /// was read: from its claim to [`observed_at`](RunRecord::observed_at). `None` unless the
    /// run is held (owned, the lease not expired) and its claim time is known.
    ///
    /// ```
    /// use lease_core::{Fence, RunId, RunRecord, RunState, RunTimes, StoreTime, WorkerId};
    /// let at = StoreTime::from_micros;
    /// let record = RunRecord::new(RunId::new("r")?, RunState::Runnable, Fence::new(1)?, at(70_000_000))
    ///     .with_lease(WorkerId::new("w")?, at(90_000_000))
    ///     .with_times(RunTimes { claimed_at: Some(at(10_000_000)), ..RunTimes::default() });
    /// assert_eq!(record.held_for(), Some(std::time::Duration::from_secs(60)));
    /// # Ok::<(), lease_core::InvalidInput>(())
    /// ```
    pub fn held_for(&self) -> Option<Duration> {
        if self.state != RunState::Runnable || self.owner.is_none() || self.is_expired() {
            return None;
        }
        self.claimed_at
            .map(|at| self.observed_at.saturating_since(at))
    }

    /// Of priority `priority` (see [`RunRecord::priority`]).
    pub fn with_priority(mut self, priority: u8) -> RunRecord {
        self.priority = priority;
        self
    }

    /// Of kind `kind` (see [`RunRecord::kind`]).
    pub fn with_kind(mut self, kind: Kind) -> RunRecord {
        self.kind = kind;
        self
    }

    /// Created with `payload` (see [`RunRecord::payload`]).
    pub fn with_payload(mut self, payload: Option<Vec<u8>>) -> RunRecord {
        self.payload = payload;
        self
    }

    /// `attempts` counted against the run's budget (see [`RunRecord::attempts`]).
    pub fn with_attempts(mut self, attempts: u64) -> RunRecord {
        self.attempts = attempts;
        self
    }

    /// Held by `owner` until `expires_at` (possibly past: an expired lease).
    pub fn with_lease(mut self, owner: WorkerId, expires_at: StoreTime) -> RunRecord {
        self.owner = Some(owner);
        self.expires_at = Some(expires_at);
        self
    }

    /// `heartbeats` renewals over the run's life.
    pub fn with_heartbeats(mut self, heartbeats: u64) -> RunRecord {
        self.heartbeats = heartbeats;
        self
    }

    /// Not claimable before `not_before` (see [`RunRecord::not_before`]).
    pub fn with_not_before(mut self, not_before: Option<StoreTime>) -> RunRecord {
        self.not_before = not_before;
        self
    }

    /// Failed with `reason` (see [`RunRecord::failure`]).
    pub fn with_failure(mut self, reason: Option<String>) -> RunRecord {
        self.failure = reason;
        self
    }

    /// How many times the run has been claimed over its whole life: its fence, which every
    /// claim raises by one. The attempt budget is [`RunRecord::attempts`], which voluntary
    /// ends do not count.
    pub fn claims(&self) -> u64 {
        self.fence.get()
    }

    /// Time left on the lease as the store saw it when read; `None` if unowned.
    pub fn remaining(&self) -> Option<Duration> {
        self.expires_at
            .map(|at| at.saturating_since(self.observed_at))
    }

    /// Whether the run is owned but its lease had expired when read, so a claim would take it.
    pub fn is_expired(&self) -> bool {
        self.owner.is_some() && self.expires_at.is_some_and(|at| at <= self.observed_at)
    }
}

impl fmt::Debug for RunRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunRecord")
            .field("run", &self.run)
            .field("state", &self.state)
            .field("owner", &self.owner)
            .field("expires_at", &self.expires_at)
            .field("fence", &self.fence)
            .field("heartbeats", &self.heartbeats)
            .field("not_before", &self.not_before)
            .field("failure", &self.failure)
            .field("attempts", &self.attempts)
            .field("kind", &self.kind)
            .field("priority", &self.priority)
            .field("payload", &PayloadSize(self.payload.as_ref().map(Vec::len)))
            .field("created_at", &self.created_at)
            .field("claimed_at", &self.claimed_at)
            .field("renewed_at", &self.renewed_at)
            .field("ended_at", &self.ended_at)
            .field("history", &self.history)
            .field("observed_at", &self.observed_at)
            .finish()
    }
}

/// One entry of a run's journal.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct JournalEntry {
    /// Position in the run's journal, from 1, gapless.
    pub seq: u64,
    /// The fence the entry was written under.
    pub fence: Fence,
    /// The caller's bytes.
    pub payload: Vec<u8>,
    /// When the store accepted it, on its clock.
    pub written_at: StoreTime,
}

impl JournalEntry {
    /// Entry `seq` of a journal, written under `fence` at `written_at` on the store's clock.
    pub fn new(seq: u64, fence: Fence, payload: Vec<u8>, written_at: StoreTime) -> JournalEntry {
        JournalEntry {
            seq,
            fence,
            payload,
            written_at,
        }
    }
}

/// Which runs [`LeaseStore::list`](crate::LeaseStore::list) returns, ordered by run id.
///
/// ```
/// use lease_core::{ListFilter, RunState};
/// let filter = ListFilter::new().with_state(RunState::Suspended).with_limit(500);
/// assert_eq!((filter.state, filter.limit, filter.expired), (Some(RunState::Suspended), 500, false));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListFilter {
    /// Only runs in this state.
    pub state: Option<RunState>,
    /// Only runs whose lease has expired by the store's clock and not been reclaimed.
    pub expired: bool,
    /// Only runs whose id sorts after this one (for paging).
    pub after: Option<RunId>,
    /// At most this many, 1 to [`MAX_LIST`](crate::MAX_LIST).
    pub limit: usize,
    /// Only runs of this kind.
    pub kind: Option<Kind>,
}

/// How many runs are in each part of their life, as [`count`](crate::LeaseStore::count) read
/// them on the store's clock. Each figure is exact up to [`MAX_COUNT`](crate::MAX_COUNT); a figure of
/// `MAX_COUNT` means at least that many (the bound on one call's work).
///
/// Backends build it from [`RunCounts::default`], setting each field.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunCounts {
    /// Runnable and claimable now: unowned (past any retry delay) or whose lease expired.
    pub claimable: u64,
    /// Runnable and leased, the lease not expired.
    pub held: u64,
    /// Runnable and unowned, inside a retry delay ([`End::RetryAfter`]).
    pub delayed: u64,
    /// Suspended, waiting for `resume`.
    pub suspended: u64,
    /// Completed.
    pub completed: u64,
    /// Failed.
    pub failed: u64,
    /// Cancelled.
    pub cancelled: u64,
    /// The queue's lag: how long the run that has waited longest has been claimable, on the
    /// store's clock (since its creation, the end of its delay or retry delay, its release, or
    /// the expiry of its last lease). `None` when no run is claimable, or when the backend
    /// cannot tell (etcd times no instants of its own).
    pub oldest_claimable_age: Option<Duration>,
    /// How long the lease held longest has been held, on the store's clock: from the claim of
    /// the held run claimed earliest to the count (a lease renewed for hours shows here; an
    /// expired one does not). `None` when nothing is held, or when the backend cannot tell
    /// (etcd times no instants of its own). Bounded like the figures: Postgres reads at most
    /// [`MAX_COUNT`](crate::MAX_COUNT) held runs per kind, Redis at most [`LONGEST_HELD_SCAN`](crate::LONGEST_HELD_SCAN) held or delayed
    /// runs per count, so beyond that it is the longest among those read.
    pub longest_held: Option<Duration>,
}

impl RunCounts {
    /// Each state's figure under its name (`claimable`, `held`, `delayed`, `suspended`,
    /// `completed`, `failed`, `cancelled`), in that order: the names the
    /// `lease_runs` gauge and `lease stats` use.
    pub fn by_state(&self) -> [(&'static str, u64); 7] {
        [
            ("claimable", self.claimable),
            ("held", self.held),
            ("delayed", self.delayed),
            ("suspended", self.suspended),
            ("completed", self.completed),
            ("failed", self.failed),
            ("cancelled", self.cancelled),
        ]
    }
}

/// Validates a [`purge`](crate::LeaseStore::purge) (`max` 1 to [`MAX_BATCH`](crate::MAX_BATCH), `older_than` at
/// most [`MAX_PURGE_AGE`](crate::MAX_PURGE_AGE)). Backends call it before any I/O.
///
/// # Errors
/// [`InvalidInput::BatchEmpty`], [`InvalidInput::BatchTooLarge`] or
/// [`InvalidInput::PurgeAgeTooLong`].
pub fn check_purge(older_than: Duration, max: usize) -> Result<(), InvalidInput> {
    check_claim_max(max)?;
    if older_than > MAX_PURGE_AGE {
        return Err(InvalidInput::PurgeAgeTooLong {
            age: older_than,
            max: MAX_PURGE_AGE,
        });
    }
    Ok(())
}

impl ListFilter {
    /// Every run, the first 100 by id (the [`Default`]).
    pub fn new() -> ListFilter {
        ListFilter::default()
    }

    /// Only runs in `state`.
    pub fn with_state(mut self, state: impl Into<Option<RunState>>) -> ListFilter {
        self.state = state.into();
        self
    }

    /// Only runs whose lease expired (`true`), or every run (`false`).
    pub fn with_expired(mut self, expired: bool) -> ListFilter {
        self.expired = expired;
        self
    }

    /// Only runs whose id sorts after `after`: the next page after a page's last run.
    pub fn with_after(mut self, after: impl Into<Option<RunId>>) -> ListFilter {
        self.after = after.into();
        self
    }

    /// At most `limit` runs, 1 to [`MAX_LIST`](crate::MAX_LIST) (checked by the store).
    pub fn with_limit(mut self, limit: usize) -> ListFilter {
        self.limit = limit;
        self
    }

    /// Only runs of `kind`, or of every kind (`None`).
    pub fn with_kind(mut self, kind: impl Into<Option<Kind>>) -> ListFilter {
        self.kind = kind.into();
        self
    }
}

impl Default for ListFilter {
    fn default() -> Self {
        ListFilter {
            state: None,
            expired: false,
            after: None,
            limit: 100,
            kind: None,
        }
    }
}

/// How a lease ends, in a batch of [`LeaseStore::end_many`](crate::LeaseStore::end_many).
///
/// Each is a fenced write, judged by the contract's rules.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum End {
    /// Complete the run: terminal, owner and expiry cleared.
    Complete,
    /// Append the payload (at most [`MAX_PAYLOAD_BYTES`](crate::MAX_PAYLOAD_BYTES)) to the run's journal under the lease's
    /// fence **and** complete the run, as one write: both happen or neither does. This is a
    /// job's durable effect and its completion in one commit.
    CompleteWith(Vec<u8>),
    /// Give the run back: runnable, claimable at once under a higher fence.
    Release,
    /// Suspend the run until [`resume`](crate::LeaseStore::resume).
    Suspend,
    /// Give the run back, runnable but not claimable before this delay (at most
    /// [`MAX_RETRY_DELAY`](crate::MAX_RETRY_DELAY), whole milliseconds) has passed on the **store's** clock: a retry
    /// with backoff. `claim_next` passes the run by until then; a `claim` of it is refused
    /// with [`Error::Delayed`](crate::Error::Delayed). A zero delay is a [`Release`](End::Release).
    /// Reported as [`Ended::Released`](crate::Ended::Released).
    RetryAfter(Duration),
    /// Give up on the run: [failed](RunState::Failed), terminal until an operator resumes it,
    /// with this reason (at most [`MAX_REASON_BYTES`](crate::MAX_REASON_BYTES)) in its record.
    Fail(String),
    /// This attempt failed (the handler's error, a panic, a timeout): give the run back, not
    /// claimable before `retry_after` has passed on the store's clock, as
    /// [`RetryAfter`](End::RetryAfter) does, but **counting the attempt** against the run's
    /// budget ([`RunRecord::attempts`]), which a snooze does not. `reason` (checked as
    /// [`Fail`](End::Fail)'s) says what failed. Reported as
    /// [`Ended::Released`](crate::Ended::Released). What a `Worker` sends for
    /// a failed attempt that its `RetryPolicy` retries.
    AttemptFailed {
        /// How long the run waits before it is claimable again (at most [`MAX_RETRY_DELAY`](crate::MAX_RETRY_DELAY)).
        retry_after: Duration,
        /// What failed.
        reason: String,
    },
    /// For a `Worker` handler: the handler already ended the lease itself, as
    /// `Ended` says, atomically with its own effect, in its own transaction (Postgres
    /// `PostgresLeaseStore::end_in` inside the caller's transaction, or a fenced transaction's
    /// `complete`; a Redis fenced script that ends the lease;
    /// `MemoryLeaseStore::fenced_with`). The Worker
    /// writes nothing more: it stops the heartbeat, checks that the store shows the lease
    /// ended this way under its fence, and reports the end committed, or reports an error if
    /// the store does not. A store's [`end_many`](crate::LeaseStore::end_many) refuses it
    /// ([`InvalidInput::AlreadyCommitted`](crate::InvalidInput::AlreadyCommitted)).
    Committed(crate::Ended),
}

impl End {
    /// The state the run is in after this end was applied.
    pub fn state(&self) -> RunState {
        match self.ended() {
            crate::Ended::Completed => RunState::Completed,
            crate::Ended::Released => RunState::Runnable,
            crate::Ended::Suspended => RunState::Suspended,
            crate::Ended::Failed => RunState::Failed,
            crate::Ended::Cancelled => RunState::Cancelled,
        }
    }

    /// How [`Error::LeaseEnded`](crate::Error::LeaseEnded) names this end once it was applied.
    pub fn ended(&self) -> crate::Ended {
        match self {
            End::Complete | End::CompleteWith(_) => crate::Ended::Completed,
            End::Release | End::RetryAfter(_) | End::AttemptFailed { .. } => crate::Ended::Released,
            End::Suspend => crate::Ended::Suspended,
            End::Fail(_) => crate::Ended::Failed,
            End::Committed(ended) => *ended,
        }
    }

    /// The end's name: `complete`, `complete-with`, `release`, `suspend`, `retry-after`,
    /// `attempt-failed`, `fail` or `committed`.
    pub fn as_str(&self) -> &'static str {
        match self {
            End::Complete => "complete",
            End::CompleteWith(_) => "complete-with",
            End::Release => "release",
            End::Suspend => "suspend",
            End::RetryAfter(_) => "retry-after",
            End::AttemptFailed { .. } => "attempt-failed",
            End::Fail(_) => "fail",
            End::Committed(_) => "committed",
        }
    }

    /// Whether this end gives the attempt back to the run's budget: a voluntary release, a
    /// suspend or a snooze ([`RetryAfter`](End::RetryAfter)). Every other end leaves the
    /// attempt counted (and a completion ends the run).
    pub fn refunds_attempt(&self) -> bool {
        matches!(self, End::Release | End::Suspend | End::RetryAfter(_))
    }

    /// The delay before the run is claimable again, in whole milliseconds: that of a
    /// [`RetryAfter`](End::RetryAfter) or an [`AttemptFailed`](End::AttemptFailed), 0 for
    /// every other end.
    pub fn delay_millis(&self) -> u64 {
        match self {
            // At most MAX_RETRY_DELAY, checked.
            End::RetryAfter(delay) => delay.as_millis() as u64,
            End::AttemptFailed { retry_after, .. } => retry_after.as_millis() as u64,
            _ => 0,
        }
    }
}

impl fmt::Debug for End {
    // A payload can be large: show its size, not its bytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            End::CompleteWith(p) => write!(f, "CompleteWith({} bytes)", p.len()),
            End::Committed(ended) => write!(f, "Committed({ended:?})"),
            End::Complete => f.write_str("Complete"),
            End::Release => f.write_str("Release"),
            End::Suspend => f.write_str("Suspend"),
            End::RetryAfter(delay) => write!(f, "RetryAfter({delay:?})"),
            End::AttemptFailed {
                retry_after,
                reason,
            } => write!(
                f,
                "AttemptFailed {{ retry_after: {retry_after:?}, reason: {} bytes }}",
                reason.len()
            ),
            End::Fail(reason) => write!(f, "Fail({} bytes)", reason.len()),
        }
    }
}

/// One lease and how it ends: an item of [`LeaseStore::end_many`](crate::LeaseStore::end_many).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Ending {
    /// The lease, whose fence the store checks.
    pub lease: Lease,
    /// How it ends.
    pub end: End,
}

impl Ending {
    /// `lease` ending with `end`.
    pub fn new(lease: Lease, end: End) -> Ending {
        Ending { lease, end }
    }
}

/// Validates an [`end_many`](crate::LeaseStore::end_many) batch: at most [`MAX_BATCH`](crate::MAX_BATCH) items,
/// every payload within [`MAX_PAYLOAD_BYTES`](crate::MAX_PAYLOAD_BYTES) and all of them within
/// [`MAX_BATCH_PAYLOAD_BYTES`](crate::MAX_BATCH_PAYLOAD_BYTES), every retry delay within [`MAX_RETRY_DELAY`](crate::MAX_RETRY_DELAY) and failure
/// reason within [`MAX_REASON_BYTES`](crate::MAX_REASON_BYTES), each run at most once. Backends call it before any
/// I/O.
///
/// # Errors
/// [`InvalidInput::BatchTooLarge`], [`InvalidInput::PayloadTooLarge`],
/// [`InvalidInput::BatchPayloadTooLarge`], [`InvalidInput::RetryDelayTooLong`],
/// [`InvalidInput::ReasonTooLong`], [`InvalidInput::AlreadyCommitted`] or
/// [`InvalidInput::DuplicateRun`].
pub fn check_end_batch(ends: &[Ending]) -> Result<(), InvalidInput> {
    check_batch(ends.len())?;
    let mut seen = std::collections::HashSet::with_capacity(ends.len());
    let mut total = 0usize;
    for ending in ends {
        match &ending.end {
            End::CompleteWith(payload) => {
                check_payload(payload)?;
                total += payload.len();
            }
            End::Committed(_) => {
                return Err(InvalidInput::AlreadyCommitted {
                    run: ending.lease.run().clone(),
                })
            }
            End::RetryAfter(delay) => check_retry_delay(*delay)?,
            End::AttemptFailed {
                retry_after,
                reason,
            } => {
                check_retry_delay(*retry_after)?;
                check_reason(reason)?;
            }
            End::Fail(reason) => check_reason(reason)?,
            End::Complete | End::Release | End::Suspend => {}
        }
        if !seen.insert(ending.lease.run()) {
            return Err(InvalidInput::DuplicateRun {
                run: ending.lease.run().clone(),
            });
        }
    }
    if total > MAX_BATCH_PAYLOAD_BYTES {
        return Err(InvalidInput::BatchPayloadTooLarge {
            len: total,
            max: MAX_BATCH_PAYLOAD_BYTES,
        });
    }
    Ok(())
}

/// Validates an [`End::RetryAfter`] delay (at most [`MAX_RETRY_DELAY`](crate::MAX_RETRY_DELAY)).
///
/// # Errors
/// [`InvalidInput::RetryDelayTooLong`].
pub fn check_retry_delay(delay: Duration) -> Result<(), InvalidInput> {
    if delay > MAX_RETRY_DELAY {
        return Err(InvalidInput::RetryDelayTooLong {
            delay,
            max: MAX_RETRY_DELAY,
        });
    }
    Ok(())
}

/// Validates an [`End::Fail`] reason: at most [`MAX_REASON_BYTES`](crate::MAX_REASON_BYTES), and no control character
/// but tabs and line feeds. Every backend stores the same reasons (Postgres cannot store a
/// NUL), and one bad reason is refused before any I/O instead of failing a whole batch.
///
/// ```
/// use lease_core::{backend::check_reason, InvalidInput};
/// assert!(check_reason("card declined:\n\tinsufficient funds").is_ok());
/// assert_eq!(
///     check_reason("bad\0byte"),
///     Err(InvalidInput::ReasonControlCharacter { at: 3, code: 0 })
/// );
/// ```
///
/// # Errors
/// [`InvalidInput::ReasonTooLong`], [`InvalidInput::ReasonControlCharacter`].
pub fn check_reason(reason: &str) -> Result<(), InvalidInput> {
    if reason.len() > MAX_REASON_BYTES {
        return Err(InvalidInput::ReasonTooLong {
            len: reason.len(),
            max: MAX_REASON_BYTES,
        });
    }
    if let Some((at, c)) = reason.char_indices().find(|&(_, c)| !reason_char(c)) {
        return Err(InvalidInput::ReasonControlCharacter {
            at,
            code: u32::from(c),
        });
    }
    Ok(())
}

/// Whether a failure reason may hold `c`: anything but a control character, except a tab or a
/// line feed.
fn reason_char(c: char) -> bool {
    !c.is_control() || c == '\t' || c == '\n'
}

/// `text` as a failure reason [`check_reason`] accepts: each control character other than a tab
/// or a line feed written as its escape (`\0`, `\u{1b}`, `\r`), then cut to at most
/// [`MAX_REASON_BYTES`](crate::MAX_REASON_BYTES) at a character boundary. What the `Worker` does to the
/// error messages it records.
///
/// ```
/// use lease_core::{backend::check_reason, sanitize_reason};
/// let reason = sanitize_reason("bad\0byte \u{1b}[31mred");
/// assert_eq!(reason, "bad\\0byte \\u{1b}[31mred");
/// assert!(check_reason(&reason).is_ok());
/// ```
pub fn sanitize_reason(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(MAX_REASON_BYTES));
    for c in text.chars() {
        if reason_char(c) {
            out.push(c);
        } else {
            out.extend(c.escape_debug());
        }
        if out.len() >= MAX_REASON_BYTES {
            break;
        }
    }
    truncate_reason(&out, MAX_REASON_BYTES).to_owned()
}

/// `text` cut to at most `max` bytes at a character boundary.
pub fn truncate_reason(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Validates a [`create_many`](crate::LeaseStore::create_many) batch (0 to [`MAX_BATCH`](crate::MAX_BATCH) ids).
/// Backends call it before any I/O.
///
/// # Errors
/// [`InvalidInput::BatchTooLarge`].
pub fn check_create_batch(runs: &[RunId]) -> Result<(), InvalidInput> {
    check_batch(runs.len())
}

pub(crate) fn check_batch(len: usize) -> Result<(), InvalidInput> {
    if len > MAX_BATCH {
        return Err(InvalidInput::BatchTooLarge {
            len,
            max: MAX_BATCH,
        });
    }
    Ok(())
}

/// Validates `claim_next`'s `max` (1 to [`MAX_BATCH`](crate::MAX_BATCH)). Backends call it before any I/O.
///
/// # Errors
/// [`InvalidInput::BatchTooLarge`] or [`InvalidInput::BatchEmpty`].
pub fn check_claim_max(max: usize) -> Result<(), InvalidInput> {
    if max == 0 {
        return Err(InvalidInput::BatchEmpty);
    }
    check_batch(max)
}

/// Validates a `renew_many` batch size (0 to [`MAX_BATCH`](crate::MAX_BATCH)). Backends call it before any I/O.
///
/// # Errors
/// [`InvalidInput::BatchTooLarge`].
pub fn check_renew_batch(len: usize) -> Result<(), InvalidInput> {
    check_batch(len)
}

/// Validates a journal payload (at most [`MAX_PAYLOAD_BYTES`](crate::MAX_PAYLOAD_BYTES)). Backends call it before any I/O.
///
/// # Errors
/// [`InvalidInput::PayloadTooLarge`].
pub fn check_payload(payload: &[u8]) -> Result<(), InvalidInput> {
    if payload.len() > MAX_PAYLOAD_BYTES {
        return Err(InvalidInput::PayloadTooLarge {
            len: payload.len(),
            max: MAX_PAYLOAD_BYTES,
        });
    }
    Ok(())
}

/// Validates a list filter's limit (1 to [`MAX_LIST`](crate::MAX_LIST)). Backends call it before any I/O.
///
/// # Errors
/// [`InvalidInput::ListLimit`].
pub fn check_list(filter: &ListFilter) -> Result<(), InvalidInput> {
    if filter.limit == 0 || filter.limit > MAX_LIST {
        return Err(InvalidInput::ListLimit {
            limit: filter.limit,
            max: MAX_LIST,
        });
    }
    Ok(())
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
