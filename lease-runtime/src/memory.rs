//! The embedded, in-process reference implementation of `LeaseStore`.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Mutex, MutexGuard};

use tokio::time::Instant;

use lease_core::backend::{
    check_claim_max, check_create_batch, check_end_batch, check_list, check_new_runs,
    check_payload, check_purge, check_renew_batch, claim_refusal, fenced_verdict,
};
use lease_core::{
    Attempt, AttemptOutcome, End, Ending, Error, Fence, IdempotencyKey, InvalidInput, JournalEntry,
    Kind, Lease, LeaseStore, ListFilter, NewRun, Result, RunId, RunRecord, RunState, StoreTime,
    Ttl, WorkerId,
};

use crate::observe::count_stale;
use crate::wake::WakesExt;

mod api;

/// A [`LeaseStore`] held in this process's memory: the reference backend, for demos, tests and
/// single-process engines. Nothing survives the process.
///
/// Its store clock is tokio's monotonic clock ([`tokio::time::Instant`]), counted from the
/// store's creation, so it never jumps and it follows `tokio::time::pause` in tests.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
/// use lease_core::{LeaseStore, RunId, Ttl, WorkerId};
/// use lease_runtime::MemoryLeaseStore;
/// let store = MemoryLeaseStore::new();
/// let run = RunId::new("order-42")?;
/// store.create(&run).await?;
/// let lease = store.claim(&run, &WorkerId::new("worker-a")?, Ttl::from_secs(30)?).await?;
/// assert_eq!(lease.fence().get(), 1);
/// store.append(&lease, b"charged card").await?;
/// store.complete(&lease).await?;
/// # Ok(()) }
/// ```
pub struct MemoryLeaseStore {
    epoch: Instant,
    state: Mutex<State>,
    wakes: lease_core::Wakes,
}

#[derive(Default)]
struct State {
    runs: HashMap<RunId, Slot>,
    /// The fence floor: the highest fence of any purged run. Every run created starts at it, so
    /// an id created again never reuses a fence its purged life issued, and a purge deletes
    /// the run outright: storage stays bounded however many runs pass through.
    floor: Fence,
    /// Claimable-since order: (instant the run became claimable, creation order) → run.
    next_order: u64,
}

struct Slot {
    state: RunState,
    owner: Option<WorkerId>,
    expires_at: Option<Instant>,
    fence: Fence,
    heartbeats: u64,
    /// When the run became (or becomes) claimable: on create, release and resume, the instant
    /// of the change; while leased, the lease's expiry.
    claimable_at: Instant,
    order: u64,
    journal: Vec<JournalEntry>,
    /// The journal entries written with an idempotency key: key → index in `journal`.
    keys: HashMap<IdempotencyKey, usize>,
    /// A failed run's reason.
    failure: Option<String>,
    /// The attempt budget's counter (see [`RunRecord::attempts`]).
    attempts: u64,
    /// The payload it was created with.
    payload: Option<std::sync::Arc<[u8]>>,
    /// Its kind.
    kind: Kind,
    /// Its priority.
    priority: u8,
    /// When it was created.
    created_at: Instant,
    /// When its latest claim took it.
    claimed_at: Option<Instant>,
    /// When its latest claim's lease was last renewed.
    renewed_at: Option<Instant>,
    /// Its ended attempts, oldest first, at most [`MAX_HISTORY`](lease_core::MAX_HISTORY).
    history: std::collections::VecDeque<lease_core::Attempt>,
}

/// The store's part of a [`MemoryLeaseStore::fenced_with`] closure: journal entries to append
/// and the lease's end, applied together once the closure returns `Ok`, and not at all if it
/// fails.
pub struct MemoryTransaction {
    lease: Lease,
    appends: Vec<Vec<u8>>,
    end: Option<End>,
}

impl MemoryTransaction {
    /// The lease the closure runs under (its fence passed the check).
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Appends `payload` to the run's journal under the lease's fence, when the closure
    /// succeeds.
    ///
    /// # Errors
    /// [`InvalidInput::PayloadTooLarge`](lease_core::InvalidInput::PayloadTooLarge).
    pub fn append(&mut self, payload: &[u8]) -> Result<()> {
        check_payload(payload)?;
        self.appends.push(payload.to_vec());
        Ok(())
    }

    /// Ends the lease as `end` says (complete, complete with an effect, release, suspend) when
    /// the closure succeeds, in the same step as its appends; the last call wins.
    ///
    /// # Errors
    /// [`InvalidInput::PayloadTooLarge`](lease_core::InvalidInput::PayloadTooLarge), or
    /// [`InvalidInput::AlreadyCommitted`](lease_core::InvalidInput::AlreadyCommitted) for
    /// [`End::Committed`].
    pub fn end(&mut self, end: End) -> Result<()> {
        check_end_batch(std::slice::from_ref(&Ending::new(
            self.lease.clone(),
            end.clone(),
        )))?;
        self.end = Some(end);
        Ok(())
    }
}

impl fmt::Debug for MemoryTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryTransaction")
            .field("lease", &self.lease)
            .field("appends", &self.appends.len())
            .field("end", &self.end)
            .finish()
    }
}

impl MemoryLeaseStore {
    /// An empty store.
    pub fn new() -> MemoryLeaseStore {
        MemoryLeaseStore {
            epoch: Instant::now(),
            state: Mutex::new(State::default()),
            wakes: lease_core::Wakes::new(),
        }
    }

    /// Wakes idle workers of the slot's kind if it is runnable and unowned: now, or when its
    /// delay ends.
    fn announce(&self, slot: &Slot, now: Instant) {
        if slot.state == RunState::Runnable && slot.owner.is_none() {
            self.wakes
                .wake_after(&slot.kind, slot.claimable_at.saturating_duration_since(now));
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a slot half-written: every mutation below
        // is computed first and assigned after all checks pass.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn store_time(&self, at: Instant) -> StoreTime {
        StoreTime::from_micros(at.saturating_duration_since(self.epoch).as_micros() as u64)
    }

    /// Creates `new` (already checked): runnable, claimable once its delay has passed.
    fn create_one(&self, new: &NewRun) -> Result<RunRecord> {
        let run = new.run();
        let now = Instant::now();
        let mut state = self.lock();
        if state.runs.contains_key(run) {
            return Err(Error::AlreadyExists { run: run.clone() });
        }
        state.next_order += 1;
        let fence = state.floor;
        let slot = Slot {
            state: RunState::Runnable,
            owner: None,
            expires_at: None,
            fence,
            heartbeats: 0,
            // A start delay or time: claimable from then, as after a retry delay. This
            // process's clock is the store's.
            claimable_at: now
                + new.delay().max(
                    new.run_at()
                        .and_then(|at| at.duration_since(std::time::SystemTime::now()).ok())
                        .unwrap_or_default(),
                ),
            order: state.next_order,
            journal: Vec::new(),
            keys: HashMap::new(),
            failure: None,
            attempts: 0,
            payload: new.payload_shared(),
            kind: new.kind().clone(),
            priority: new.priority(),
            created_at: now,
            claimed_at: None,
            renewed_at: None,
            history: std::collections::VecDeque::new(),
        };
        let record = self.record_with_payload(run, &slot, now);
        self.announce(&slot, now);
        state.runs.insert(run.clone(), slot);
        Ok(record)
    }

    /// The record with its payload and history, as inspect and create return it.
    fn record_with_payload(&self, run: &RunId, slot: &Slot, now: Instant) -> RunRecord {
        self.record(run, slot, now)
            .with_payload(slot.payload.as_deref().map(<[u8]>::to_vec))
            .with_history(slot.history.iter().cloned().collect())
    }

    /// Writes the held or expired lease's attempt into the history as `outcome`, ended at
    /// `now`, or as expired at its expiry if it had expired by then: a force-release, a
    /// cancel or a claim that came after the expiry did not end the attempt, the expiry did.
    fn archive(&self, slot: &mut Slot, outcome: AttemptOutcome, error: Option<&str>, now: Instant) {
        match slot.expires_at {
            Some(at) if at <= now => self.push_attempt(slot, AttemptOutcome::Expired, None, at),
            Some(_) => self.push_attempt(slot, outcome, error, now),
            None => {}
        }
    }

    /// Writes the lease's attempt into the history as `outcome`, ended at `ended`. Called
    /// before the end clears the owner or refunds the attempt; nothing for an unowned slot.
    fn push_attempt(
        &self,
        slot: &mut Slot,
        outcome: AttemptOutcome,
        error: Option<&str>,
        ended: Instant,
    ) {
        let Some(worker) = slot.owner.clone() else {
            return;
        };
        let attempt = Attempt::new(slot.attempts, slot.fence, worker, outcome)
            .with_times(
                slot.claimed_at.map(|at| self.store_time(at)),
                Some(self.store_time(ended)),
            )
            .with_error(error.map(|e| lease_core::attempt_error(e).to_owned()));
        if slot.history.len() == lease_core::MAX_HISTORY {
            slot.history.pop_front();
        }
        slot.history.push_back(attempt);
    }

    fn record(&self, run: &RunId, slot: &Slot, now: Instant) -> RunRecord {
        // Built as every backend builds its records (`RunRecord` is non-exhaustive): new, then
        // each field the store knows.
        let mut record = RunRecord::new(run.clone(), slot.state, slot.fence, self.store_time(now));
        record.owner = slot.owner.clone();
        record.expires_at = slot.expires_at.map(|at| self.store_time(at));
        record.heartbeats = slot.heartbeats;
        record.not_before = Self::delay(slot, now).map(|_| self.store_time(slot.claimable_at));
        record.failure = slot.failure.clone();
        record.attempts = slot.attempts;
        record.kind = slot.kind.clone();
        record.priority = slot.priority;
        record.created_at = Some(self.store_time(slot.created_at));
        record.claimed_at = slot.claimed_at.map(|at| self.store_time(at));
        record.renewed_at = slot.renewed_at.map(|at| self.store_time(at));
        // For an ended run, `claimable_at` is when it ended.
        record.ended_at = matches!(
            slot.state,
            RunState::Completed | RunState::Failed | RunState::Cancelled
        )
        .then(|| self.store_time(slot.claimable_at));
        record.claimable_since =
            (slot.state == RunState::Runnable && slot.owner.is_none() && slot.claimable_at <= now)
                .then(|| self.store_time(slot.claimable_at));
        record
    }

    /// Whether the run ended (completed, failed or cancelled) at least `older_than` before `now`: for an
    /// ended run, `claimable_at` is when it ended.
    fn purgeable(slot: &Slot, older_than: std::time::Duration, now: Instant) -> bool {
        matches!(
            slot.state,
            RunState::Completed | RunState::Failed | RunState::Cancelled
        ) && now.saturating_duration_since(slot.claimable_at) >= older_than
    }

    /// How long before a runnable, unowned run given back with a retry delay is claimable;
    /// `None` if it is (or the run is in any other state).
    fn delay(slot: &Slot, now: Instant) -> Option<std::time::Duration> {
        (slot.state == RunState::Runnable && slot.owner.is_none() && slot.claimable_at > now)
            .then(|| slot.claimable_at - now)
    }

    /// Leaves the slot unowned as of `now` (claimable from then if runnable; for an ended run,
    /// when it ended: retention's age), as force-release and cancel do.
    fn unown(slot: &mut Slot, now: Instant) {
        slot.owner = None;
        slot.expires_at = None;
        slot.claimable_at = now;
    }

    fn lease(&self, run: &RunId, slot: &Slot, ttl: Ttl) -> Lease {
        let owner = slot.owner.clone().expect("a leased slot has an owner");
        let expires_at = self.store_time(slot.expires_at.expect("a leased slot has an expiry"));
        Lease::new(run.clone(), owner, slot.fence, ttl, expires_at)
            .expect("a claimed slot's fence is at least 1")
            .with_attempt(slot.attempts)
            .with_payload(slot.payload.clone())
            .with_kind(slot.kind.clone())
            .with_priority(slot.priority)
    }

    /// Takes the slot for `worker` if the claim rules allow it.
    fn try_claim(
        &self,
        run: &RunId,
        slot: &mut Slot,
        worker: &WorkerId,
        ttl: Ttl,
        now: Instant,
    ) -> Result<Lease> {
        let remaining = slot.expires_at.map(|at| at.saturating_duration_since(now));
        if let Some(refusal) = claim_refusal(
            run,
            slot.state,
            slot.owner.as_ref(),
            remaining,
            Self::delay(slot, now),
            slot.fence,
        ) {
            return Err(refusal);
        }
        // Claimable since the expiry of the lease before, or since claimable_at.
        let since = slot.expires_at.unwrap_or(slot.claimable_at);
        // An expired lease taken over: its attempt ended at its expiry.
        self.archive(slot, AttemptOutcome::Expired, None, now);
        let expires_at = now + ttl.as_duration();
        slot.fence = Fence::new(slot.fence.get() + 1).expect("claim_refusal checked Fence::MAX");
        // Every claim counts; a voluntary end gives it back (apply_end, end).
        slot.attempts += 1;
        slot.owner = Some(worker.clone());
        slot.expires_at = Some(expires_at);
        slot.claimable_at = expires_at;
        slot.claimed_at = Some(now);
        slot.renewed_at = None;
        Ok(self
            .lease(run, slot, ttl)
            .with_waited(Some(now.saturating_duration_since(since))))
    }

    /// Applies `write` to the run if `lease` may write, per the fenced-write rules.
    fn fenced<T>(&self, lease: &Lease, write: impl FnOnce(&mut Slot, Instant) -> T) -> Result<T> {
        let now = Instant::now();
        let mut state = self.lock();
        let slot = writable(&mut state, lease)?;
        Ok(write(slot, now))
    }

    /// Runs `effect` under the store's lock once `lease` passed the fenced-write rules, so the
    /// caller's own effect (a map of its own, a counter: anything `effect` writes) and the
    /// store's part — journal entries and the lease's end, through the
    /// [`MemoryTransaction`] — happen as one step, as a Postgres transaction or a Redis fenced
    /// script makes them: no other call of the store runs in between, and the store's part is
    /// applied only if `effect` returns `Ok`. What `effect` itself wrote before failing stays
    /// written (the store cannot undo the caller's memory): write it last, or only when
    /// nothing after it can fail. `effect` must not call the store (its lock is held).
    ///
    /// The embedded store's "effect and end together", to test handlers that end their lease
    /// with their effect ([`End::Committed`]) without a server.
    ///
    /// # Errors
    /// The fenced-write verdicts of the [contract](LeaseStore#contract) (`effect` does not run),
    /// or `effect`'s own error (the store's part is not applied).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
    /// use std::collections::HashMap;
    /// use lease_core::{End, LeaseStore, RunId, RunState, Ttl, WorkerId};
    /// use lease_runtime::MemoryLeaseStore;
    /// let store = MemoryLeaseStore::new();
    /// let run = RunId::new("order-42")?;
    /// store.create(&run).await?;
    /// let lease = store.claim(&run, &WorkerId::new("w")?, Ttl::from_secs(30)?).await?;
    /// let mut payments: HashMap<String, u64> = HashMap::new();
    /// store.fenced_with(&lease, |tx| {
    ///     tx.end(End::Complete)?;
    ///     payments.insert(run.to_string(), tx.lease().fence().get()); // last: cannot fail
    ///     Ok::<_, lease_core::Error>(())
    /// })?;
    /// assert_eq!(store.inspect(&run).await?.state, RunState::Completed);
    /// assert_eq!(payments[run.as_str()], 1);
    /// # Ok(()) }
    /// ```
    pub fn fenced_with<T, E>(
        &self,
        lease: &Lease,
        effect: impl FnOnce(&mut MemoryTransaction) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E>
    where
        E: From<Error>,
    {
        let now = Instant::now();
        let mut state = self.lock();
        let slot = writable(&mut state, lease)?;
        let mut tx = MemoryTransaction {
            lease: lease.clone(),
            appends: Vec::new(),
            end: None,
        };
        let value = effect(&mut tx)?;
        for payload in tx.appends {
            self.push_entry(slot, lease.fence(), payload, None, now);
        }
        if let Some(end) = tx.end {
            self.apply_end(slot, lease.fence(), end, now);
            self.announce(slot, now);
        }
        Ok(value)
    }

    /// Appends one journal entry, with its key if any.
    fn push_entry(
        &self,
        slot: &mut Slot,
        fence: Fence,
        payload: Vec<u8>,
        key: Option<&IdempotencyKey>,
        now: Instant,
    ) -> JournalEntry {
        let entry = JournalEntry::new(
            slot.journal.len() as u64 + 1,
            fence,
            payload,
            self.store_time(now),
        );
        if let Some(key) = key {
            slot.keys.insert(key.clone(), slot.journal.len());
        }
        slot.journal.push(entry.clone());
        entry
    }

    /// Ends the lease held under `fence` as `end` says (its effect journaled first).
    fn apply_end(&self, slot: &mut Slot, fence: Fence, end: End, now: Instant) {
        let to = end.state();
        let delay = std::time::Duration::from_millis(end.delay_millis());
        if let Some((outcome, error)) = AttemptOutcome::of_end(&end) {
            // The fenced-write rules passed, so the lease had not been taken over: it ends now.
            // The fence accepted the end, expired or not: it is what ended the attempt.
            self.push_attempt(slot, outcome, error, now);
        }
        if end.refunds_attempt() {
            slot.attempts = slot.attempts.saturating_sub(1);
        }
        match end {
            End::CompleteWith(payload) => {
                self.push_entry(slot, fence, payload, None, now);
            }
            End::Fail(reason) => slot.failure = Some(reason),
            _ => {}
        }
        slot.state = to;
        slot.owner = None;
        slot.expires_at = None;
        // For a completed or failed run, when it ended (retention's age).
        slot.claimable_at = now + delay;
    }

    fn renew_one(&self, lease: &Lease) -> Result<Lease> {
        self.fenced(lease, |slot, now| {
            let expires_at = now + lease.ttl().as_duration();
            slot.expires_at = Some(expires_at);
            slot.claimable_at = expires_at;
            slot.renewed_at = Some(now);
            slot.heartbeats += 1;
            self.lease(lease.run(), slot, lease.ttl())
                .with_waited(lease.waited())
        })
    }

    /// Ends the lease: owner and expiry cleared, state set to `to`; a release or a suspend
    /// gives the attempt back.
    fn end(&self, lease: &Lease, to: RunState) -> Result<()> {
        self.fenced(lease, |slot, now| {
            let outcome = match to {
                RunState::Completed => AttemptOutcome::Completed,
                RunState::Suspended => AttemptOutcome::Suspended,
                _ => AttemptOutcome::Released,
            };
            self.push_attempt(slot, outcome, None, now);
            if matches!(to, RunState::Runnable | RunState::Suspended) {
                slot.attempts = slot.attempts.saturating_sub(1);
            }
            slot.state = to;
            slot.owner = None;
            slot.expires_at = None;
            slot.claimable_at = now;
            self.announce(slot, now);
        })
    }
}

/// The run `lease` writes to, if the fenced-write rules let it.
fn writable<'a>(state: &'a mut State, lease: &Lease) -> Result<&'a mut Slot> {
    let slot = state
        .runs
        .get_mut(lease.run())
        .ok_or_else(|| Error::NotFound {
            run: lease.run().clone(),
        })?;
    verdict(lease, slot)?;
    Ok(slot)
}

/// The fenced-write verdict on `lease` of what `slot` holds.
fn verdict(lease: &Lease, slot: &Slot) -> Result<()> {
    count_stale(fenced_verdict(
        lease.run(),
        lease.fence(),
        slot.fence,
        slot.state,
        slot.owner.is_some(),
    ))
}

impl Default for MemoryLeaseStore {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemoryLeaseStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryLeaseStore")
            .field("runs", &self.lock().runs.len())
            .finish()
    }
}

impl fmt::Display for MemoryLeaseStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("memory:")
    }
}
