//! The `LeaseStore` trait and the verdict rules every backend shares.

use std::fmt;
use std::time::Duration;

use crate::error::{Ended, Error, Result};
use crate::id::{IdempotencyKey, RunId, WorkerId};
use crate::types::{End, Ending, Fence, JournalEntry, Lease, ListFilter, RunRecord, RunState, Ttl};

/// Durable TTL leases on runs, guarded by fencing tokens.
///
/// # Contract
///
/// Every check runs atomically in the store (one conditional statement, one transaction or one
/// script), on the **store's** clock; the caller's clock is never consulted. Each successful
/// claim returns a fence greater than every earlier fence for that run, so fences never repeat.
///
/// A *fenced write* ([`renew`](LeaseStore::renew), [`renew_many`](LeaseStore::renew_many),
/// [`append`](LeaseStore::append), [`release`](LeaseStore::release),
/// [`suspend`](LeaseStore::suspend), [`complete`](LeaseStore::complete), and any write an
/// adapter offers) is accepted iff the presented fence equals the run's stored fence and the
/// lease is still held (not released, suspended, completed, failed or cancelled). Otherwise, in
/// this order:
///
/// - [`Error::NotFound`] if the run does not exist;
/// - [`Error::StaleFence`] if the presented fence is lower than the stored one;
/// - [`Error::FenceAhead`] if it is higher (the store never issued it);
/// - [`Error::LeaseEnded`] if it is equal but the lease was released, suspended, completed or
///   failed by its holder, or the run was [cancelled](LeaseStore::cancel).
///
/// Expiry alone never rejects a write: a holder whose lease expired may still write until
/// someone reclaims the run, which moves the fence. [`fenced_verdict`](crate::backend::fenced_verdict) implements these rules
/// for backends that must explain a conditional write that matched nothing.
///
/// # Kinds, priorities and start times
///
/// A run's [kind](crate::Kind), priority and payload are fixed by its create. A claim of a kind
/// ([`claim_next_kind`](LeaseStore::claim_next_kind); [`claim_next`](LeaseStore::claim_next) for
/// the default kind) hands out only runs of that kind, and reads only that kind's indexes; it
/// takes the claimable runs of the highest priority first
/// ([`NewRun::with_priority`](crate::NewRun::with_priority)), the longest waiting first within
/// a priority, and returns them in that order. Every lease and record says its run's kind and
/// priority. A run created with a delay or a `run_at`
/// ([`NewRun`](crate::NewRun)) is not claimable before it has passed on the store's clock. A
/// backend that cannot keep one of these refuses the create with
/// [`InvalidInput::Unsupported`](crate::InvalidInput::Unsupported) before any I/O, rather than
/// weakening it.
///
/// # Cancel safety
///
/// Dropping a returned future before it completes leaves the operation applied or not applied;
/// the caller cannot tell which. An applied claim that the caller never saw expires by its TTL,
/// and its fence is never reused. An applied fenced write is as if the caller had seen it.
///
/// Implementing a backend: see [`backend`](crate::backend) (the shared checks and verdict
/// rules, and how this trait evolves: methods added later come with defaults), and run the
/// `lease-conformance` suite against it; passing it is the definition of a correct backend.
#[async_trait::async_trait] // object-safe: workers hold Arc<dyn LeaseStore>
pub trait LeaseStore: fmt::Debug + fmt::Display + Send + Sync + 'static {
    /// Creates `run` as runnable and unowned, with fence 0, no heartbeats and no attempts — or,
    /// for an id that was [purged](LeaseStore::purge), with the fence it had when it was
    /// purged, so its next claim continues above every fence it ever issued (its attempt
    /// budget starts afresh).
    ///
    /// # Errors
    /// [`Error::AlreadyExists`]; nothing is changed.
    async fn create(&self, run: &RunId) -> Result<RunRecord>;

    /// Claims `run` for `worker` for `ttl` if it is runnable and unowned or expired, and not
    /// delayed ([`End::RetryAfter`]) past the store's now. Sets the owner, sets the expiry to the
    /// store's now plus `ttl`, increments the fence, and raises the run's attempt counter
    /// ([`RunRecord::attempts`](crate::RunRecord::attempts)) in the same write; the lease
    /// carries the counter's new value ([`Lease::attempt`](crate::Lease::attempt)).
    ///
    /// # Errors
    /// [`Error::Held`] (holder, time left), [`Error::Delayed`] (time left before it is
    /// claimable), [`Error::Suspended`], [`Error::Completed`], [`Error::Failed`],
    /// [`Error::NotFound`], [`Error::FenceExhausted`].
    async fn claim(&self, run: &RunId, worker: &WorkerId, ttl: Ttl) -> Result<Lease>;

    /// Claims up to `max` (1 to [`MAX_BATCH`](crate::MAX_BATCH)) claimable runs (runnable and
    /// unowned or expired, and not delayed past the store's now), those claimable longest
    /// first (a delayed run counts as claimable from the end of its delay). Returns an empty list when none is.
    /// Concurrent callers never receive the same run under the same fence.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for `max` out of range.
    async fn claim_next(&self, worker: &WorkerId, ttl: Ttl, max: usize) -> Result<Vec<Lease>>;

    /// [`claim_next`](LeaseStore::claim_next) of runs of `kind` only
    /// ([`NewRun::with_kind`](crate::NewRun::with_kind)), through that kind's own index:
    /// runs of other kinds are neither claimed nor walked past. `claim_next` is this call
    /// with the [`DEFAULT_KIND`](crate::DEFAULT_KIND).
    ///
    /// The default implementation serves the default kind with `claim_next` and refuses any
    /// other with [`InvalidInput::Unsupported`](crate::InvalidInput::Unsupported), as a
    /// backend without kinds refuses to create a run of another kind.
    ///
    /// # Errors
    /// As [`claim_next`](LeaseStore::claim_next).
    async fn claim_next_kind(
        &self,
        kind: &crate::Kind,
        worker: &WorkerId,
        ttl: Ttl,
        max: usize,
    ) -> Result<Vec<Lease>> {
        crate::kind::refuse_kinds([kind])?;
        self.claim_next(worker, ttl, max).await
    }

    /// [`claim_next_kind`](LeaseStore::claim_next_kind) of runs in `queue` only
    /// ([`NewRun::with_queue`](crate::NewRun::with_queue)): runs of other queues are neither
    /// claimed nor walked past, and while `queue` is [paused](LeaseStore::pause_queue) the
    /// call claims nothing and answers an empty list (the pause is read in the claim's own
    /// atomic step, so no claim that starts after `pause_queue` returned takes a run of the
    /// queue). `claim_next_kind` is this call with the
    /// [`DEFAULT_QUEUE`](crate::DEFAULT_QUEUE). A claim by id
    /// ([`claim`](LeaseStore::claim)) takes a run whatever its queue: a pause holds back the
    /// workers, not an operator.
    ///
    /// The default implementation serves the default queue with `claim_next_kind` and
    /// refuses any other with [`InvalidInput::Unsupported`](crate::InvalidInput::Unsupported);
    /// it knows no pause.
    ///
    /// # Errors
    /// As [`claim_next`](LeaseStore::claim_next).
    async fn claim_next_in(
        &self,
        queue: &crate::Queue,
        kind: &crate::Kind,
        worker: &WorkerId,
        ttl: Ttl,
        max: usize,
    ) -> Result<Vec<Lease>> {
        crate::queue::refuse_queues([queue])?;
        self.claim_next_kind(kind, worker, ttl, max).await
    }

    /// Pauses `queue`, fleet-wide: from the moment this returns, no
    /// [`claim_next_in`](LeaseStore::claim_next_in) (and so no `Worker`) claims a run of it
    /// until [`resume_queue`](LeaseStore::resume_queue); leases already held run to their
    /// ends, and runs keep being created in it. Stored, so it outlives the caller and every
    /// worker. Pausing a paused queue, or a queue with no runs, is allowed and changes nothing
    /// else. Returns the queue's state as stored.
    ///
    /// The default implementation refuses with
    /// [`InvalidInput::Unsupported`](crate::InvalidInput::Unsupported).
    ///
    /// # Errors
    /// The backend being unavailable; then the pause may or may not be stored (sending it
    /// again is safe).
    async fn pause_queue(&self, queue: &crate::Queue) -> Result<crate::QueueState> {
        let _ = queue;
        Err(crate::InvalidInput::Unsupported {
            operation: "pause_queue",
        }
        .into())
    }

    /// Resumes `queue`: claims take its runs again, and the store's wake-ups tell idle
    /// workers. Resuming a queue that is not paused changes nothing. Returns the queue's state
    /// as stored.
    ///
    /// The default implementation refuses with
    /// [`InvalidInput::Unsupported`](crate::InvalidInput::Unsupported).
    ///
    /// # Errors
    /// As [`pause_queue`](LeaseStore::pause_queue).
    async fn resume_queue(&self, queue: &crate::Queue) -> Result<crate::QueueState> {
        let _ = queue;
        Err(crate::InvalidInput::Unsupported {
            operation: "resume_queue",
        }
        .into())
    }

    /// The queues that have runnable runs (claimable, held or delayed) or were ever paused or
    /// resumed, by name (the first [`MAX_QUEUES_LISTED`](crate::MAX_QUEUES_LISTED)), each
    /// paused or not; [`changed_at`](crate::QueueState::changed_at) is `None` for a queue
    /// never paused or resumed. A queue whose runs are all suspended or ended, and that was
    /// never paused, is not listed.
    ///
    /// The default implementation refuses with
    /// [`InvalidInput::Unsupported`](crate::InvalidInput::Unsupported).
    ///
    /// # Errors
    /// The backend being unavailable.
    async fn queues(&self) -> Result<Vec<crate::QueueState>> {
        Err(crate::InvalidInput::Unsupported {
            operation: "queues",
        }
        .into())
    }

    /// The heartbeat: a fenced write that sets the expiry to the store's now plus the lease's
    /// TTL and increments the run's `heartbeats`. Returns the lease with its new expiry.
    ///
    /// # Errors
    /// The fenced-write verdicts of the [contract](LeaseStore#contract).
    async fn renew(&self, lease: &Lease) -> Result<Lease>;

    /// [`renew`](LeaseStore::renew) for up to [`MAX_BATCH`](crate::MAX_BATCH) leases in one
    /// round trip, with one result per lease, in order. One lease's rejection does not affect
    /// the others.
    ///
    /// # Errors
    /// The outer error when the batch as a whole could not be decided (unavailable, too large).
    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>>;

    /// Appends `payload` (at most [`MAX_PAYLOAD_BYTES`](crate::MAX_PAYLOAD_BYTES)) to the run's
    /// journal under the lease's fence; a fenced write.
    ///
    /// # Errors
    /// The fenced-write verdicts of the [contract](LeaseStore#contract).
    async fn append(&self, lease: &Lease, payload: &[u8]) -> Result<JournalEntry>;

    /// [`append`](LeaseStore::append) that applies **once per key**, so a caller can retry an
    /// unanswered append (its reply was lost; it may have been applied) safely. In one atomic
    /// step:
    ///
    /// 1. the fence first: a presented fence lower or higher than the run's is refused
    ///    ([`Error::StaleFence`], [`Error::FenceAhead`]) **even if the key was used**;
    /// 2. if the run's journal holds an entry written with `key` (under any fence), that entry
    ///    is returned and nothing is written, whatever the lease's state: a retry learns its
    ///    first result, even after the lease ended;
    /// 3. else the fenced-write rules, then the payload is appended with `key`.
    ///
    /// Keys are per run and kept as long as its journal.
    ///
    /// The default implementation refuses with
    /// [`InvalidInput::Unsupported`](crate::InvalidInput::Unsupported) rather than append
    /// without the check: a backend written before this method keeps compiling and never
    /// weakens the promise silently.
    ///
    /// # Errors
    /// The fenced-write verdicts of the [contract](LeaseStore#contract), as above.
    async fn append_keyed(
        &self,
        lease: &Lease,
        key: &IdempotencyKey,
        payload: &[u8],
    ) -> Result<JournalEntry> {
        let _ = (lease, key, payload);
        Err(crate::InvalidInput::Unsupported {
            operation: "append_keyed",
        }
        .into())
    }

    /// The run's journal, in order; each entry records the fence it was written under.
    ///
    /// # Errors
    /// [`Error::NotFound`].
    async fn journal(&self, run: &RunId) -> Result<Vec<JournalEntry>>;

    /// Gives the run back: owner and expiry cleared, still runnable, claimable at once by
    /// anyone (under a higher fence). A fenced write.
    ///
    /// # Errors
    /// The fenced-write verdicts of the [contract](LeaseStore#contract).
    async fn release(&self, lease: &Lease) -> Result<()>;

    /// Suspends the run (it waits on a human or a webhook): owner and expiry cleared, state
    /// `suspended`, not claimable until [`resume`](LeaseStore::resume). A fenced write.
    ///
    /// **A retry after an unanswered call** (for example [`Error::Unavailable`]: the call may
    /// have been applied) that answers [`Error::LeaseEnded`] with the lease's own fence and
    /// [`Ended::Suspended`](crate::Ended::Suspended) means the first call was applied: only the
    /// lease's holder can end the run under its fence. `RunScope::suspend` (`lease-runtime`)
    /// treats that answer as success.
    ///
    /// # Errors
    /// The fenced-write verdicts of the [contract](LeaseStore#contract).
    async fn suspend(&self, lease: &Lease) -> Result<()>;

    /// Ends up to [`MAX_BATCH`](crate::MAX_BATCH) leases in **one round trip and one commit**,
    /// each as its [`End`] says, with one result per item, in order. Each item is a fenced write
    /// judged on its own (one item's refusal does not affect the others), and
    /// [`End::CompleteWith`] appends its payload and completes the run as one write.
    ///
    /// This is group commit: a worker collects the ends of many jobs and pays for one commit.
    /// An item's `Ok(())` means its end is durable as the backend's configuration promises.
    ///
    /// **Recognising a retried end.** If the call failed without an answer (for example
    /// [`Error::Unavailable`]) it may or may not have been applied. Retrying it is safe: an item
    /// that was applied now returns [`Error::LeaseEnded`] with the **same fence** and the
    /// [`Ended`](crate::Ended) of its end ([`End::ended`]) — the lease's holder is the only one
    /// who can end the run under that fence, so that answer means the first attempt committed.
    ///
    /// # Errors
    /// The outer error when the batch as a whole could not be decided: [`Error::InvalidInput`]
    /// (more than `MAX_BATCH` items, a payload over the limit, the same run twice) before any
    /// I/O, or the backend being unavailable. Per item: the fenced-write verdicts of the
    /// [contract](LeaseStore#contract).
    ///
    /// [`End::RetryAfter`] releases the run with a delay counted on the store's clock from the
    /// commit; [`End::AttemptFailed`] does the same with the attempt kept counted;
    /// [`End::Fail`] fails it with its reason (terminal until
    /// [`resume`](LeaseStore::resume)). A voluntary end ([`End::refunds_attempt`]: release,
    /// suspend, retry-after) gives its attempt back to the run's budget in the same write, as
    /// [`release`](LeaseStore::release) and [`suspend`](LeaseStore::suspend) do; the others
    /// leave it counted. A backend written before these ends must refuse them as
    /// [`InvalidInput::Unsupported`](crate::InvalidInput::Unsupported), never release instead.
    async fn end_many(&self, ends: &[Ending]) -> Result<Vec<Result<()>>>;

    /// Whether [`end_many_with_effects`](LeaseStore::end_many_with_effects) applies `effect`
    /// (it is this store's kind of [`Effect`](crate::Effect)). The default takes none.
    fn takes_effect(&self, effect: &crate::Effect) -> bool {
        let _ = effect;
        false
    }

    /// [`end_many`](LeaseStore::end_many) where an item may carry an
    /// [`Effect`](crate::Effect) (`effects[i]` goes with `ends[i]`), applied in the transaction
    /// that commits its end: under the lease's fence check (an effect whose lease was lost is
    /// never run; its item gets the verdict), in a savepoint of its own. An item's `Ok(())`
    /// means its effect and its end committed together; an effect that failed was rolled back
    /// alone and its item is [`Error::EffectFailed`](crate::Error::EffectFailed), nothing
    /// written for it and its lease still held, while the other items commit.
    ///
    /// A retry after an unanswered call is recognised as for `end_many` (an applied item
    /// answers [`Error::LeaseEnded`] under its own fence, its effect not run again).
    ///
    /// # Errors
    /// As `end_many`; [`InvalidInput::Effects`](crate::InvalidInput::Effects) before any I/O
    /// when the slices differ in length or an effect is not one this store
    /// [takes](LeaseStore::takes_effect). The default takes none: a call with an effect is
    /// refused so, one without is an `end_many`.
    async fn end_many_with_effects(
        &self,
        ends: &[Ending],
        effects: &[Option<crate::Effect>],
    ) -> Result<Vec<Result<()>>> {
        crate::backend::check_effects(self, ends, effects)?;
        self.end_many(ends).await
    }

    /// Creates up to [`MAX_BATCH`](crate::MAX_BATCH) runs in one round trip, each as
    /// [`create`](LeaseStore::create) would, with one result per id, in order
    /// ([`Error::AlreadyExists`] for an id that exists, including the second copy of an id
    /// repeated in the batch). For loading a backlog.
    ///
    /// # Errors
    /// The outer error when the batch as a whole could not be decided (unavailable, too large).
    async fn create_many(&self, runs: &[RunId]) -> Result<Vec<Result<()>>>;

    /// Makes a suspended or failed run runnable again, claimable at once (a failed run's reason
    /// is cleared), with a fresh attempt budget. The next claim takes a higher fence.
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::NotSuspended`].
    async fn resume(&self, run: &RunId) -> Result<RunRecord>;

    /// Delivers a signal's `payload` to the wait of `fence` for `name` on `run`: the run
    /// becomes claimable (a fresh attempt budget, as after a resume) and its next leases carry
    /// the signal ([`Lease::resumed`]), only if it still waits in that wait, before its
    /// deadline. The same delivery made again (same wait, name and payload) answers
    /// [`Signalled::duplicate`](crate::Signalled) and changes nothing, whatever the run did
    /// since, until it waits again. Atomic, and confirmed as an end is (replica
    /// acknowledgements, synchronous standbys). Callers use
    /// [`SignalExt::signal`](crate::SignalExt::signal), which checks the token first.
    ///
    /// The default refuses with [`InvalidInput::Unsupported`](crate::InvalidInput::Unsupported):
    /// a backend without signals, whose [`Capabilities::signals`](crate::Capabilities) is
    /// false.
    ///
    /// # Errors
    /// [`Error::StaleSignal`] naming the run's state and the
    /// [`SignalRefusal`](crate::SignalRefusal), with nothing stored; [`Error::NotFound`].
    async fn deliver_signal(
        &self,
        run: &RunId,
        name: &crate::SignalName,
        fence: crate::Fence,
        payload: &[u8],
    ) -> Result<crate::Signalled> {
        let _ = (run, name, fence, payload);
        Err(crate::InvalidInput::Unsupported {
            operation: "signals",
        }
        .into())
    }

    /// The key this store's [`SignalToken`](crate::SignalToken)s are signed and checked with,
    /// when one is configured (see [`SignalKey`](crate::SignalKey)). The default is `None`.
    fn signal_key(&self) -> Option<&crate::SignalKey> {
        None
    }

    /// Completes the run: terminal, owner and expiry cleared. A fenced write.
    ///
    /// **A retry after an unanswered call** (for example [`Error::Unavailable`]: the call may
    /// have been applied) that answers [`Error::LeaseEnded`] with the lease's own fence and
    /// [`Ended::Completed`](crate::Ended::Completed) means the first call was applied: only the
    /// lease's holder can end the run under its fence. `RunScope::complete` (`lease-runtime`)
    /// treats that answer as success; so does [`release`](LeaseStore::release) with
    /// [`Ended::Released`](crate::Ended::Released) (there, an operator's `force_release` answers
    /// the same, and the run is released either way).
    ///
    /// # Errors
    /// The fenced-write verdicts of the [contract](LeaseStore#contract).
    async fn complete(&self, lease: &Lease) -> Result<()>;

    /// Reads the run's record.
    ///
    /// # Errors
    /// [`Error::NotFound`].
    async fn inspect(&self, run: &RunId) -> Result<RunRecord>;

    /// Reads up to [`MAX_BATCH`](crate::MAX_BATCH) runs' records in one round trip, one result
    /// per id, in order ([`Error::NotFound`] for a run that does not exist).
    ///
    /// The default implementation calls [`inspect`](LeaseStore::inspect) once per id; the
    /// backends of this workspace read them all in one round trip.
    ///
    /// # Errors
    /// The outer error when the batch as a whole could not be read (unavailable, too large).
    async fn inspect_many(&self, runs: &[RunId]) -> Result<Vec<Result<RunRecord>>> {
        crate::types::check_batch(runs.len())?;
        let mut records = Vec::with_capacity(runs.len());
        for run in runs {
            match self.inspect(run).await {
                Err(e) if !e.is_verdict() => return Err(e),
                other => records.push(other),
            }
        }
        Ok(records)
    }

    /// Reads the records that match `filter`, ordered by run id.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a limit out of range.
    async fn list(&self, filter: &ListFilter) -> Result<Vec<RunRecord>>;

    /// Administrative takeover: clears the owner and expiry of a runnable run whoever holds it,
    /// without a fence. The fence is unchanged, so the old holder's writes fail with
    /// [`Error::LeaseEnded`] until the next claim, which takes a higher fence and makes them
    /// fail with [`Error::StaleFence`].
    ///
    /// A delayed run ([`End::RetryAfter`]) becomes claimable at once.
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::Suspended`], [`Error::Completed`], [`Error::Failed`].
    async fn force_release(&self, run: &RunId) -> Result<RunRecord>;

    /// Creates a run as [`create`](LeaseStore::create) does, with what `new` asks for
    /// (a start delay on the store's clock: see [`NewRun`](crate::NewRun)), in one atomic
    /// write: a run created with a delay is never claimable before it is over, whoever
    /// claims. The record shows the delay's end in
    /// [`not_before`](crate::RunRecord::not_before).
    ///
    /// With a [unique key](crate::NewRun::with_unique_key), while another run with the key is
    /// live (runnable or suspended) nothing is created and the answer is
    /// [`Error::AlreadyExists`] naming **that** run; two creates racing with one key create
    /// one run. A store that keeps no keys refuses the create.
    ///
    /// The default implementation creates a plain `new` with [`create`](LeaseStore::create),
    /// and refuses any other with [`InvalidInput::Unsupported`](crate::InvalidInput::Unsupported).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
    /// use std::time::Duration;
    /// use lease_core::{Error, LeaseStore, NewRun, RunId, Ttl, WorkerId};
    /// use lease_runtime::MemoryLeaseStore;
    /// let store = MemoryLeaseStore::new();
    /// let run = RunId::new("reminder-7")?;
    /// let record = store
    ///     .create_with(&NewRun::new(run.clone()).with_delay(Duration::from_secs(3600)))
    ///     .await?;
    /// assert!(record.not_before.is_some());
    /// assert!(matches!(
    ///     store.claim(&run, &WorkerId::new("w1")?, Ttl::from_secs(30)?).await,
    ///     Err(Error::Delayed { .. })
    /// ));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`create`](LeaseStore::create); [`Error::InvalidInput`] for a delay over
    /// [`MAX_START_DELAY`](crate::MAX_START_DELAY), before any I/O.
    async fn create_with(&self, new: &crate::NewRun) -> Result<RunRecord> {
        new.check()?;
        if new.is_plain() {
            return self.create(new.run()).await;
        }
        Err(crate::InvalidInput::Unsupported {
            operation: "create_with",
        }
        .into())
    }

    /// [`create_many`](LeaseStore::create_many) with each run's [`NewRun`](crate::NewRun):
    /// one round trip and one commit for the batch, a result per item in order. An item whose
    /// unique key a live run holds, or an earlier item of the batch took, is
    /// [`Error::AlreadyExists`] naming that run.
    ///
    /// The default implementation creates a batch of plain runs with
    /// [`create_many`](LeaseStore::create_many), and refuses any other with
    /// [`InvalidInput::Unsupported`](crate::InvalidInput::Unsupported).
    ///
    /// # Errors
    /// As [`create_many`](LeaseStore::create_many); [`Error::InvalidInput`] for an item
    /// [`NewRun::check`](crate::NewRun::check) refuses, before any I/O (nothing is created).
    async fn create_many_with(&self, runs: &[crate::NewRun]) -> Result<Vec<Result<()>>> {
        crate::backend::check_new_runs(runs)?;
        if runs.iter().all(crate::NewRun::is_plain) {
            let ids: Vec<RunId> = runs.iter().map(|n| n.run().clone()).collect();
            return self.create_many(&ids).await;
        }
        Err(crate::InvalidInput::Unsupported {
            operation: "create_many_with",
        }
        .into())
    }

    /// Ends `run` for good, whatever state it is in but completed: waiting, delayed,
    /// suspended, failed or **held**. The run becomes [`Cancelled`](RunState::Cancelled)
    /// with `reason` (at most [`MAX_REASON_BYTES`](crate::MAX_REASON_BYTES), no control
    /// character but tabs and line feeds, as [`End::Fail`]'s), unowned, and is never claimed
    /// again. The fence is unchanged and no claim can take a higher one, so a holder's next
    /// fenced write, end or renewal, and an effect it commits through a store's transactional
    /// path, is refused with [`Error::LeaseEnded`] naming [`Ended::Cancelled`](crate::Ended::Cancelled):
    /// the cancel and the holder's end are ordered by the store, and exactly one of them wins.
    /// A `RunScope`'s token (`lease-runtime`) is cancelled at its next heartbeat.
    ///
    /// Cancelling a cancelled run returns its record unchanged (the first reason stays), so a
    /// retried cancel confirms what the first did. [`purge`](LeaseStore::purge) removes
    /// cancelled runs after the retention age, as completed and failed ones.
    ///
    /// The default implementation refuses with
    /// [`InvalidInput::Unsupported`](crate::InvalidInput::Unsupported).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
    /// use lease_core::{Ended, Error, LeaseStore, RunId, RunState, Ttl, WorkerId};
    /// use lease_runtime::MemoryLeaseStore;
    /// let store = MemoryLeaseStore::new();
    /// let run = RunId::new("charge-42")?;
    /// store.create(&run).await?;
    /// let lease = store.claim(&run, &WorkerId::new("w1")?, Ttl::from_secs(30)?).await?;
    /// let record = store.cancel(&run, "customer asked").await?;
    /// assert_eq!(record.state, RunState::Cancelled);
    /// assert_eq!(record.failure.as_deref(), Some("customer asked"));
    /// // The holder is fenced out, with a verdict that names the cancel.
    /// assert!(matches!(
    ///     store.complete(&lease).await,
    ///     Err(Error::LeaseEnded { ended: Ended::Cancelled, .. })
    /// ));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a bad reason, before any I/O; [`Error::NotFound`];
    /// [`Error::Completed`] (its effect happened: there is nothing left to cancel).
    async fn cancel(&self, run: &RunId, reason: &str) -> Result<RunRecord> {
        let _ = (run, reason);
        Err(crate::InvalidInput::Unsupported {
            operation: "cancel",
        }
        .into())
    }

    /// Retention: removes up to `max` (1 to [`MAX_BATCH`](crate::MAX_BATCH)) runs that ended
    /// (completed, failed or cancelled) at least `older_than` ago by the store's clock, oldest end first,
    /// with their journals and idempotency keys, and returns their ids; an empty list when
    /// none is due. Each call's work is bounded by `max`: call again until it returns fewer
    /// than `max`.
    ///
    /// **Purging deletes, and a fence is never reused.** Nothing of a purged run is kept:
    /// the purge raises the store's *fence floor* (one number per namespace) to the run's
    /// fence, every [`create`](LeaseStore::create) starts a run at the floor, and the first
    /// claim of a run's life takes a fence above the floor, so no lease of an id created
    /// again carries a fence a lease of its purged life carried, and a writer still holding
    /// an old lease is refused (`LeaseEnded` or `StaleFence`). Storage stays flat however
    /// many runs pass through. A run that is resumed or otherwise changed while a purge looks
    /// at it is not removed.
    ///
    /// The default implementation refuses with
    /// [`InvalidInput::Unsupported`](crate::InvalidInput::Unsupported).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for `max` out of range or `older_than` over
    /// [`MAX_PURGE_AGE`](crate::MAX_PURGE_AGE), before any I/O; the backend being
    /// unavailable.
    async fn purge(&self, older_than: Duration, max: usize) -> Result<Vec<RunId>> {
        let _ = (older_than, max);
        Err(crate::InvalidInput::Unsupported { operation: "purge" }.into())
    }

    /// [`purge`](LeaseStore::purge) of the runs that ended in one of `states` only: how a
    /// [`Retention`](crate::Retention) keeps failed runs longer than completed ones. Same
    /// rules, same order (oldest end first), same bound on `max`.
    ///
    /// The default implementation calls [`purge`](LeaseStore::purge) for
    /// [`EndedStates::ALL`](crate::EndedStates::ALL) and refuses any other set with
    /// [`InvalidInput::Unsupported`](crate::InvalidInput::Unsupported).
    ///
    /// # Errors
    /// As [`purge`](LeaseStore::purge).
    async fn purge_ended(
        &self,
        states: crate::EndedStates,
        older_than: Duration,
        max: usize,
    ) -> Result<Vec<RunId>> {
        if states == crate::EndedStates::ALL {
            return self.purge(older_than, max).await;
        }
        crate::backend::check_purge(older_than, max)?;
        Err(crate::InvalidInput::Unsupported {
            operation: "purge_ended",
        }
        .into())
    }

    /// Removes those of `runs` (at most [`MAX_BATCH`](crate::MAX_BATCH)) that have ended
    /// (completed, failed or cancelled), whatever their age, as [`purge`](LeaseStore::purge)
    /// removes a run: nothing of it is kept, and the fence floor rises to its fence. The
    /// others (runnable, held, suspended, not found, or locked by another call) are left
    /// alone. Returns the ids removed. A `Scheduler` (`lease-runtime`) removes its own
    /// lease run with it when it starts the run's journal afresh.
    ///
    /// The default implementation refuses with
    /// [`InvalidInput::Unsupported`](crate::InvalidInput::Unsupported).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a batch over [`MAX_BATCH`](crate::MAX_BATCH), before any I/O; the backend
    /// being unavailable.
    async fn purge_ids(&self, runs: &[RunId]) -> Result<Vec<RunId>> {
        crate::backend::check_create_batch(runs)?;
        Err(crate::InvalidInput::Unsupported {
            operation: "purge_ids",
        }
        .into())
    }

    /// How many runs are claimable, held, delayed, suspended, completed, failed and cancelled, each
    /// counted up to [`MAX_COUNT`](crate::MAX_COUNT) so one call's work is bounded, without
    /// listing them (for a gauge of what is waiting).
    ///
    /// The default implementation refuses with
    /// [`InvalidInput::Unsupported`](crate::InvalidInput::Unsupported).
    ///
    /// # Errors
    /// The backend being unavailable.
    async fn count(&self) -> Result<crate::RunCounts> {
        Err(crate::InvalidInput::Unsupported { operation: "count" }.into())
    }

    /// The runnable runs (claimable, held or delayed) of each kind that has any, with the
    /// kind's queue lag: the first [`MAX_KINDS_COUNTED`](crate::MAX_KINDS_COUNTED) kinds by
    /// name, each figure counted up to [`MAX_COUNT`](crate::MAX_COUNT), so one call's work is
    /// bounded. Suspended and ended runs are counted by [`count`](LeaseStore::count) only.
    /// What `lease stats` shows by kind, and the per-kind series of
    /// `observe::spawn_counts` (`lease-runtime`).
    ///
    /// The default implementation refuses with
    /// [`InvalidInput::Unsupported`](crate::InvalidInput::Unsupported), as etcd's does (it
    /// cannot tell a kind's claimable runs from its held ones without reading them).
    ///
    /// # Errors
    /// The backend being unavailable.
    async fn count_kinds(&self) -> Result<Vec<crate::KindCounts>> {
        Err(crate::InvalidInput::Unsupported {
            operation: "count_kinds",
        }
        .into())
    }

    /// How many runs a [`purge`](LeaseStore::purge) with this age would remove, counted
    /// without removing anything (`lease purge --dry-run`).
    ///
    /// The default implementation refuses with
    /// [`InvalidInput::Unsupported`](crate::InvalidInput::Unsupported).
    ///
    /// # Errors
    /// The backend being unavailable.
    async fn count_purgeable(&self, older_than: Duration) -> Result<u64> {
        let _ = older_than;
        Err(crate::InvalidInput::Unsupported {
            operation: "count_purgeable",
        }
        .into())
    }

    /// The store's wake-ups: sent when a run becomes claimable (created, released, given back
    /// after a retry delay or a scheduled start, resumed, force-released), by any client of the
    /// store, so that an idle `Worker` (`lease-runtime`) claims at once instead of at its next
    /// poll. One listener per store feeds every receiver; the first call starts it (call it
    /// within a Tokio runtime).
    ///
    /// Wake-ups are hints that may be lost or duplicated, never grants: a woken worker claims
    /// through the store, and a worker with wake-ups still polls, rarely
    /// (`WorkerConfig::with_wake_poll_interval`).
    /// An expired lease sends none; the fallback poll finds it.
    ///
    /// The default is `None`: the store sends none and its workers poll.
    fn wakes(&self) -> Option<crate::Wakes> {
        None
    }

    /// What this store supports and how finely it times leases: read by callers that adapt
    /// to the store, and by the conformance suite, which holds the store to it (a scenario
    /// skips only what the store says it lacks, and checks that it does lack it).
    ///
    /// The default is [`Capabilities::default`](crate::Capabilities::default): the whole
    /// contract, timed to the millisecond. A backend that lacks a part says so.
    fn capabilities(&self) -> crate::Capabilities {
        crate::Capabilities::default()
    }
}

/// The verdict on a fenced write, given what the store holds for the run.
///
/// `current` is the stored fence, `state` the run's state and `owned` whether it has an owner.
/// Backends whose conditional write matched nothing call this with the row they then read, so
/// every backend explains a rejection the same way. Returns `Ok(())` when the write is allowed.
///
/// A pure function: it counts nothing. The backends of this workspace pass its answer through
/// `lease_runtime::observe::count_stale`, which counts a [`Error::StaleFence`] in the
/// `lease_stale_writes_refused_total` series where the verdict is decided.
///
/// # Errors
/// [`Error::StaleFence`], [`Error::FenceAhead`] or [`Error::LeaseEnded`], per the
/// [contract](LeaseStore#contract).
pub fn fenced_verdict(
    run: &RunId,
    presented: Fence,
    current: Fence,
    state: RunState,
    owned: bool,
) -> Result<()> {
    let (presented, current) = (presented.get(), current.get());
    if presented < current {
        return Err(Error::StaleFence {
            run: run.clone(),
            presented,
            current,
        });
    }
    if presented > current {
        return Err(Error::FenceAhead {
            run: run.clone(),
            presented,
            current,
        });
    }
    let ended = match state {
        RunState::Completed => Ended::Completed,
        RunState::Suspended => Ended::Suspended,
        RunState::Failed => Ended::Failed,
        RunState::Cancelled => Ended::Cancelled,
        RunState::Runnable if !owned => Ended::Released,
        RunState::Runnable => return Ok(()),
    };
    Err(Error::LeaseEnded {
        run: run.clone(),
        fence: presented,
        ended,
    })
}

/// Why a claim of an existing run was refused, given what the store holds for it; `None` if the
/// claim is allowed. `remaining` is the holder's time left by the store's clock (`None` or zero
/// when unowned or expired); `delayed` the time left before an unowned run given back with a
/// retry delay is claimable (`None` or zero when it is).
pub fn claim_refusal(
    run: &RunId,
    state: RunState,
    owner: Option<&WorkerId>,
    remaining: Option<Duration>,
    delayed: Option<Duration>,
    current: Fence,
) -> Option<Error> {
    match state {
        RunState::Suspended => Some(Error::Suspended { run: run.clone() }),
        RunState::Completed => Some(Error::Completed { run: run.clone() }),
        RunState::Failed => Some(Error::Failed { run: run.clone() }),
        RunState::Cancelled => Some(Error::Cancelled { run: run.clone() }),
        RunState::Runnable => match (owner, remaining, delayed) {
            (Some(owner), Some(remaining), _) if !remaining.is_zero() => Some(Error::Held {
                run: run.clone(),
                owner: owner.clone(),
                remaining,
            }),
            (None, _, Some(remaining)) if !remaining.is_zero() => Some(Error::Delayed {
                run: run.clone(),
                remaining,
            }),
            _ if current >= Fence::MAX => Some(Error::FenceExhausted { run: run.clone() }),
            _ => None,
        },
    }
}

/// Conveniences over any [`LeaseStore`].
#[async_trait::async_trait]
pub trait LeaseStoreExt: LeaseStore {
    /// Creates `run` unless it exists; returns its record either way.
    ///
    /// # Errors
    /// As [`LeaseStore::create`] and [`LeaseStore::inspect`], except `AlreadyExists`.
    async fn ensure(&self, run: &RunId) -> Result<RunRecord> {
        match self.create(run).await {
            Err(Error::AlreadyExists { .. }) => self.inspect(run).await,
            other => other,
        }
    }

    /// [`complete`](LeaseStore::complete) for many leases in one round trip and one commit,
    /// through [`end_many`](LeaseStore::end_many).
    ///
    /// # Errors
    /// As [`LeaseStore::end_many`].
    async fn complete_many(&self, leases: &[Lease]) -> Result<Vec<Result<()>>> {
        self.end_many(&endings(leases, End::Complete)).await
    }

    /// [`release`](LeaseStore::release) for many leases in one round trip and one commit,
    /// through [`end_many`](LeaseStore::end_many).
    ///
    /// # Errors
    /// As [`LeaseStore::end_many`].
    async fn release_many(&self, leases: &[Lease]) -> Result<Vec<Result<()>>> {
        self.end_many(&endings(leases, End::Release)).await
    }

    /// Appends `payload` under the lease's fence and completes the run, as one write
    /// ([`End::CompleteWith`]).
    ///
    /// # Errors
    /// The fenced-write verdicts of the [contract](LeaseStore#contract), or
    /// [`Error::InvalidInput`] for a payload over the limit.
    async fn complete_with(&self, lease: &Lease, payload: &[u8]) -> Result<()> {
        let item = Ending::new(lease.clone(), End::CompleteWith(payload.to_vec()));
        let mut results = self.end_many(std::slice::from_ref(&item)).await?;
        match results.pop() {
            Some(result) if results.is_empty() => result,
            _ => Err(Error::backend(
                "lease-core",
                "end_many answered a batch of one with a different number of results",
            )),
        }
    }

    /// Gives the run back, not claimable before `delay` has passed on the store's clock
    /// ([`End::RetryAfter`]), through [`end_many`](LeaseStore::end_many).
    ///
    /// # Errors
    /// The fenced-write verdicts of the [contract](LeaseStore#contract), or
    /// [`Error::InvalidInput`] for a delay over [`MAX_RETRY_DELAY`](crate::MAX_RETRY_DELAY).
    async fn retry_after(&self, lease: &Lease, delay: Duration) -> Result<()> {
        self.end_one(lease, End::RetryAfter(delay)).await
    }

    /// Gives up on the run ([`End::Fail`]): failed with `reason` until
    /// [`resume`](LeaseStore::resume), through [`end_many`](LeaseStore::end_many).
    ///
    /// # Errors
    /// The fenced-write verdicts of the [contract](LeaseStore#contract), or
    /// [`Error::InvalidInput`] for a reason over [`MAX_REASON_BYTES`](crate::MAX_REASON_BYTES).
    async fn fail(&self, lease: &Lease, reason: &str) -> Result<()> {
        self.end_one(lease, End::Fail(reason.to_owned())).await
    }

    /// Ends one lease through [`end_many`](LeaseStore::end_many).
    ///
    /// # Errors
    /// As [`LeaseStore::end_many`] for one item.
    async fn end_one(&self, lease: &Lease, end: End) -> Result<()> {
        let item = Ending::new(lease.clone(), end);
        let mut results = self.end_many(std::slice::from_ref(&item)).await?;
        match results.pop() {
            Some(result) if results.is_empty() => result,
            _ => Err(Error::backend(
                "lease-core",
                "end_many answered a batch of one with a different number of results",
            )),
        }
    }
}

fn endings(leases: &[Lease], end: End) -> Vec<Ending> {
    leases
        .iter()
        .map(|lease| Ending::new(lease.clone(), end.clone()))
        .collect()
}

impl<S: LeaseStore + ?Sized> LeaseStoreExt for S {}
