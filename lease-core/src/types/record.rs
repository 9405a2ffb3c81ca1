//! What a store says of a run: its record and times, its journal entries, counts, and the
//! filter of a list.

use super::*;

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
    /// The run's queue ([`NewRun::with_queue`](crate::NewRun::with_queue)): the
    /// [`DEFAULT_QUEUE`](crate::DEFAULT_QUEUE) for a run created without one.
    pub queue: Queue,
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
    /// For a suspended run waiting for a signal ([`End::await_signal`](crate::End::await_signal)):
    /// what it waits for, until when, and the wait's fence. `None` otherwise.
    pub wait: Option<crate::Wait>,
    /// How its last wait ended (a signal, or a timeout), until it waits again; `None` for a run
    /// that never waited, or where the call does not read it (`list`).
    pub resumed: Option<crate::WaitEnd>,
    /// The trace context the run was created under
    /// ([`NewRun::with_trace_parent`](crate::NewRun::with_trace_parent)); `None` for a run
    /// created without one, and from the calls that return many records (`list`).
    pub trace_parent: Option<crate::TraceParent>,
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
            queue: Queue::default(),
            priority: 0,
            created_at: None,
            claimed_at: None,
            renewed_at: None,
            ended_at: None,
            history: None,
            claimable_since: None,
            wait: None,
            resumed: None,
            trace_parent: None,
            observed_at,
        }
    }

    /// Created under the trace context `parent` (see [`RunRecord::trace_parent`]).
    pub fn with_trace_parent(mut self, parent: Option<crate::TraceParent>) -> RunRecord {
        self.trace_parent = parent;
        self
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

    /// In queue `queue` (see [`RunRecord::queue`]).
    pub fn with_queue(mut self, queue: Queue) -> RunRecord {
        self.queue = queue;
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
            .field("queue", &self.queue)
            .field("priority", &self.priority)
            .field("payload", &PayloadSize(self.payload.as_ref().map(Vec::len)))
            .field("created_at", &self.created_at)
            .field("claimed_at", &self.claimed_at)
            .field("renewed_at", &self.renewed_at)
            .field("ended_at", &self.ended_at)
            .field("history", &self.history)
            .field("trace_parent", &self.trace_parent)
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
    /// Only runs in this queue.
    pub queue: Option<Queue>,
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

    /// Only runs in `queue`, or in every queue (`None`): what waits in a paused queue.
    pub fn with_queue(mut self, queue: impl Into<Option<Queue>>) -> ListFilter {
        self.queue = queue.into();
        self
    }

    /// Whether a run of `kind` in `queue` passes the kind and queue filters.
    pub fn keeps(&self, kind: &Kind, queue: &Queue) -> bool {
        self.kind.as_ref().is_none_or(|k| k == kind)
            && self.queue.as_ref().is_none_or(|q| q == queue)
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
            queue: None,
        }
    }
}
