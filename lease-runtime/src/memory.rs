//! The embedded, in-process reference implementation of `LeaseStore`.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Mutex, MutexGuard};

use tokio::time::Instant;

use lease_core::backend::{
    check_claim_max, check_create_batch, check_end_batch, check_list, check_new_runs,
    check_payload, check_purge, check_renew_batch,
};
use lease_core::machine::{self, Op};
use lease_core::{
    End, Ending, Error, Fence, IdempotencyKey, JournalEntry, Kind, Lease, LeaseStore, ListFilter,
    NewRun, Queue, QueueState, Result, RunId, RunRecord, RunState, StoreTime, Ttl, WorkerId,
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
    signal_key: Option<lease_core::SignalKey>,
}

#[derive(Default)]
struct State {
    runs: HashMap<RunId, Slot>,
    /// The fence floor: the highest fence of any purged run. Every run created starts at it, so
    /// an id created again never reuses a fence its purged life issued, and a purge deletes
    /// the run outright: storage stays bounded however many runs pass through.
    floor: Fence,
    /// Creation order, to break ties in claimable-since order.
    next_order: u64,
    /// Unique key → the run that took it last. The run holds it while it is live (runnable or
    /// suspended); an ended or purged run's entry is stale and the next create takes it over.
    unique: HashMap<std::sync::Arc<str>, RunId>,
    /// Every queue ever paused or resumed: whether it is paused, and since when.
    queues: BTreeMap<lease_core::Queue, (bool, StoreTime)>,
}

impl State {
    /// The live run holding unique key `key`, if any.
    fn holder(&self, key: &str) -> Option<RunId> {
        let run = self.unique.get(key)?;
        let live = self
            .runs
            .get(run)
            .is_some_and(|slot| matches!(slot.run.state, RunState::Runnable | RunState::Suspended));
        live.then(|| run.clone())
    }

    /// Removes a purged run, lifting the fence floor over it and dropping its unique key.
    fn remove(&mut self, run: &RunId) -> Option<Slot> {
        let slot = self.runs.remove(run)?;
        self.floor = self.floor.max(slot.run.fence);
        if let Some(key) = &slot.unique_key {
            if self.unique.get(key) == Some(run) {
                self.unique.remove(key);
            }
        }
        Some(slot)
    }
}

/// One run: its record, driven by [`machine::step`] (the contract's rules, written once), and
/// what the store keeps beside it.
struct Slot {
    run: machine::Run,
    /// Creation order.
    order: u64,
    journal: Vec<JournalEntry>,
    /// The journal entries written with an idempotency key: key → index in `journal`.
    keys: HashMap<IdempotencyKey, usize>,
    /// The payload it was created with.
    payload: Option<std::sync::Arc<[u8]>>,
    /// Its unique key, if it was created with one.
    unique_key: Option<std::sync::Arc<str>>,
    /// The trace context it was created under.
    trace_parent: Option<lease_core::TraceParent>,
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
            signal_key: None,
        }
    }

    /// The same store, signing and checking [`SignalToken`](lease_core::SignalToken)s with
    /// `key` (see [`SignalKey`](lease_core::SignalKey)).
    #[must_use]
    pub fn with_signal_key(mut self, key: lease_core::SignalKey) -> MemoryLeaseStore {
        self.signal_key = Some(key);
        self
    }

    /// The store's key, for [`LeaseStore::signal_key`].
    pub(crate) fn key(&self) -> Option<&lease_core::SignalKey> {
        self.signal_key.as_ref()
    }

    /// Wakes idle workers of the slot's kind if it is runnable and unowned (now, or when its
    /// delay ends), or waits for a signal until a deadline (when it passes).
    fn announce(&self, slot: &Slot, now: StoreTime) {
        let run = &slot.run;
        let timed_wait = run.state == RunState::Suspended
            && run.wait.as_ref().is_some_and(|w| w.deadline.is_some());
        if (run.state == RunState::Runnable && run.owner.is_none()) || timed_wait {
            self.wakes
                .wake_after(&run.kind, run.claimable_at.saturating_since(now));
        }
    }

    /// Stores `queue` as paused or not, at the store's now.
    fn set_paused(&self, queue: &Queue, paused: bool) -> QueueState {
        let now = self.now();
        let mut state = self.lock();
        let entry = state.queues.entry(queue.clone()).or_insert((paused, now));
        if entry.0 != paused {
            *entry = (paused, now);
        }
        QueueState::new(queue.clone(), entry.0, Some(entry.1))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a slot half-written: `machine::step`
        // changes a record only once all its checks passed.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The store's clock: tokio's monotonic clock, counted from the store's creation.
    fn now(&self) -> StoreTime {
        StoreTime::from_micros(
            Instant::now()
                .saturating_duration_since(self.epoch)
                .as_micros() as u64,
        )
    }

    /// Creates `new` (already checked): runnable, claimable once its delay has passed.
    fn create_one(&self, new: &NewRun) -> Result<RunRecord> {
        let run = new.run();
        let now = self.now();
        let mut state = self.lock();
        if state.runs.contains_key(run) {
            return Err(Error::AlreadyExists { run: run.clone() });
        }
        let key: Option<std::sync::Arc<str>> = new.unique_key().map(Into::into);
        if let Some(holder) = key.as_ref().and_then(|k| state.holder(k)) {
            return Err(Error::AlreadyExists { run: holder });
        }
        if let Some(key) = &key {
            state.unique.insert(key.clone(), run.clone());
        }
        state.next_order += 1;
        // A start delay or time: claimable from then, as after a retry delay. This
        // process's clock is the store's.
        let wait = new.delay().max(
            new.run_at()
                .and_then(|at| at.duration_since(std::time::SystemTime::now()).ok())
                .unwrap_or_default(),
        );
        let claimable_at = StoreTime::from_micros(now.as_micros() + wait.as_micros() as u64);
        let slot = Slot {
            run: machine::Run::created(
                new.kind().clone(),
                new.priority(),
                state.floor,
                now,
                claimable_at,
            )
            .in_queue(new.queue().clone()),
            order: state.next_order,
            journal: Vec::new(),
            keys: HashMap::new(),
            payload: new.payload_shared(),
            unique_key: key,
            trace_parent: new.trace_parent().cloned(),
        };
        let record = record_with_payload(run, &slot, now);
        self.announce(&slot, now);
        state.runs.insert(run.clone(), slot);
        Ok(record)
    }

    /// Applies `op` to the run `id`, whose slot is `slot`, and wakes its kind's workers if it
    /// became claimable.
    fn step<'a>(
        &self,
        id: &RunId,
        slot: &mut Slot,
        op: Op<'a>,
        now: StoreTime,
    ) -> Result<machine::Applied<'a>> {
        let applied = machine::step(id, &mut slot.run, op, now)?;
        self.announce(slot, now);
        Ok(applied)
    }

    /// Claims the slot for `worker` if the claim rules allow it.
    fn try_claim(
        &self,
        run: &RunId,
        slot: &mut Slot,
        worker: &WorkerId,
        ttl: Ttl,
        now: StoreTime,
    ) -> Result<Lease> {
        let waited = match machine::step(run, &mut slot.run, Op::Claim { worker, ttl }, now)? {
            machine::Applied::Claimed { waited } => waited,
            _ => unreachable!("a claim answers Claimed"),
        };
        Ok(lease_of(run, slot, ttl).with_waited(Some(waited)))
    }

    /// Applies `write` to the run if `lease` may write, per the fenced-write rules.
    fn fenced<T>(&self, lease: &Lease, write: impl FnOnce(&mut Slot, StoreTime) -> T) -> Result<T> {
        let now = self.now();
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
        let now = self.now();
        let mut state = self.lock();
        let slot = writable(&mut state, lease)?;
        let mut tx = MemoryTransaction {
            lease: lease.clone(),
            appends: Vec::new(),
            end: None,
        };
        let value = effect(&mut tx)?;
        for payload in tx.appends {
            push_entry(slot, lease.fence(), payload, None, now);
        }
        if let Some(end) = tx.end {
            self.end_in(slot, lease, &end, now)?;
        }
        Ok(value)
    }

    /// Ends `lease` as `end` says, its effect journaled in the same step.
    fn end_in(&self, slot: &mut Slot, lease: &Lease, end: &End, now: StoreTime) -> Result<()> {
        let op = Op::End { lease, end };
        if let machine::Applied::Ended {
            journal: Some(entry),
        } = self.step(lease.run(), slot, op, now)?
        {
            push_entry(slot, lease.fence(), entry.to_vec(), None, now);
        }
        Ok(())
    }

    fn renew_one(&self, lease: &Lease) -> Result<Lease> {
        let now = self.now();
        let mut state = self.lock();
        let slot = found(&mut state, lease.run())?;
        let op = Op::Renew {
            lease,
            ttl: lease.ttl(),
        };
        count_stale(machine::step(lease.run(), &mut slot.run, op, now))?;
        Ok(lease_of(lease.run(), slot, lease.ttl()).with_waited(lease.waited()))
    }

    /// Ends the lease as `end` says.
    fn end(&self, lease: &Lease, end: End) -> Result<()> {
        let now = self.now();
        let mut state = self.lock();
        let slot = found(&mut state, lease.run())?;
        count_stale(self.end_in(slot, lease, &end, now))
    }
}

/// The record with its payload and history, as inspect and create return it.
fn record_with_payload(run: &RunId, slot: &Slot, now: StoreTime) -> RunRecord {
    slot.run
        .record(run, now)
        .with_payload(slot.payload.as_deref().map(<[u8]>::to_vec))
        .with_history(slot.run.history.iter().cloned().collect())
        .with_trace_parent(slot.trace_parent.clone())
}

/// The lease the slot's holder has, with the run's payload.
fn lease_of(run: &RunId, slot: &Slot, ttl: Ttl) -> Lease {
    slot.run
        .lease(run, ttl)
        .expect("a claimed or renewed run has a holder and a fence of at least 1")
        .with_payload(slot.payload.clone())
        .with_trace_parent(slot.trace_parent.clone())
}

/// Appends one journal entry, with its key if any.
fn push_entry(
    slot: &mut Slot,
    fence: Fence,
    payload: Vec<u8>,
    key: Option<&IdempotencyKey>,
    now: StoreTime,
) -> JournalEntry {
    let entry = JournalEntry::new(slot.journal.len() as u64 + 1, fence, payload, now);
    if let Some(key) = key {
        slot.keys.insert(key.clone(), slot.journal.len());
    }
    slot.journal.push(entry.clone());
    entry
}

/// The slot of `run`, or `NotFound`.
fn found<'a>(state: &'a mut State, run: &RunId) -> Result<&'a mut Slot> {
    state
        .runs
        .get_mut(run)
        .ok_or_else(|| Error::NotFound { run: run.clone() })
}

/// The run `lease` writes to, if the fenced-write rules let it.
fn writable<'a>(state: &'a mut State, lease: &Lease) -> Result<&'a mut Slot> {
    let slot = found(state, lease.run())?;
    verdict(lease, slot)?;
    Ok(slot)
}

/// The fenced-write verdict on `lease` of what `slot` holds.
fn verdict(lease: &Lease, slot: &Slot) -> Result<()> {
    count_stale(slot.run.check_write(lease.run(), lease))
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
