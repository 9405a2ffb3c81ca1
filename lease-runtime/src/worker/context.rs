//! What a handler sees and returns, and what a [`Worker`](crate::Worker)(super::Worker) reports.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use lease_core::{BoxError, End, Fence, JournalEntry, Lease, LeaseStore, Result, RunId};
use tokio_util::sync::CancellationToken;

use crate::jobs::ArgsError;
use crate::scope::RunScope;

/// What a handler is given for one claimed run: the run, its lease and fence, the cancellation
/// token it must observe, and fenced writes under the lease.
///
/// The context does not end the lease: the handler returns an [`End`] and the worker ends it
/// in its next batch.
#[derive(Clone)]
pub struct RunContext {
    pub(super) scope: Arc<RunScope>,
    /// The attempt's token: a child of the scope's, also cancelled at the attempt deadline.
    pub(super) token: CancellationToken,
    /// The run's payload, as the claim read it.
    pub(super) payload: Option<Arc<[u8]>>,
    /// The effect to commit with the end ([`RunContext::set_effect`]), shared by the clones.
    pub(super) effect: Arc<std::sync::Mutex<Option<lease_core::Effect>>>,
}

impl RunContext {
    /// The run.
    pub fn run(&self) -> &RunId {
        self.scope.run()
    }

    /// The run's kind ([`NewRun::with_kind`](lease_core::NewRun::with_kind)): which handler of
    /// [`Kinds`](crate::Kinds) runs it.
    pub fn kind(&self) -> lease_core::Kind {
        self.scope.lease().kind().clone()
    }

    /// The lease as of its latest renewal.
    pub fn lease(&self) -> Lease {
        self.scope.lease()
    }

    /// The fence every write under this lease presents.
    pub fn fence(&self) -> Fence {
        self.scope.fence()
    }

    /// Cancelled when the lease may be lost (a refused renewal, the local deadline), when the
    /// attempt outlives its [deadline](crate::WorkerConfig::with_attempt_timeout), or when a
    /// shutdown's grace period ends. Stop work when it is: what the handler returns after a
    /// cancellation that was not the shutdown counts as a failed attempt. Blocking work in
    /// `spawn_blocking` takes a clone and checks it between steps: the worker stops waiting
    /// for the handler, but cannot stop a thread (see [`Worker`](crate::Worker)'s *Handlers
    /// that block their thread*).
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    /// Whether the token is cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Completes when the token is cancelled. Cancel safe.
    pub async fn cancelled(&self) {
        self.token.cancelled().await
    }

    /// Which attempt of the run's budget this is ([`Lease::attempt`]).
    pub fn attempt(&self) -> u64 {
        self.scope.lease().attempt()
    }

    /// The run's payload ([`NewRun::with_payload`](lease_core::NewRun::with_payload)), as the
    /// claim read it; `None` for a run created without one.
    pub fn payload(&self) -> Option<&[u8]> {
        self.payload.as_deref()
    }

    /// The trace context the run was enqueued under ([`NewRun::with_trace_parent`](lease_core::NewRun::with_trace_parent)),
    /// which this attempt's `job` span continues (see [`trace`](crate::trace)); `None` for a
    /// run created without one.
    pub fn trace_parent(&self) -> Option<lease_core::TraceParent> {
        self.scope.lease().trace_parent().cloned()
    }

    /// The run's payload read as JSON into `T`: a payments handler starts with
    /// `let charge: Charge = ctx.args()?;`. A run without a payload, or with one that is not
    /// `T`, is an [`ArgsError`], which `?` turns into a failed attempt (retried under the
    /// [`RetryPolicy`](crate::RetryPolicy), failed at the last), never a panic.
    /// [`Kinds::job`](crate::Kinds::job) decodes before the handler runs, and fails the run at
    /// once instead.
    ///
    /// # Errors
    /// [`ArgsError::Missing`], [`ArgsError::Invalid`].
    pub fn args<T: serde::de::DeserializeOwned>(&self) -> std::result::Result<T, ArgsError> {
        crate::jobs::args::decode(self.run(), self.payload())
    }

    /// Appends to the run's journal under the lease's fence; the store's verdict is returned.
    ///
    /// # Errors
    /// As [`LeaseStore::append`].
    pub async fn append(&self, payload: &[u8]) -> Result<JournalEntry> {
        self.scope.append(payload).await
    }

    /// Hands the worker `effect` to run **in the transaction that ends this run's lease**, with
    /// the ends of other jobs: the effect and the end the handler returns commit together or
    /// not at all, at the cost of a savepoint rather than a transaction of its own. The store
    /// runs it under the lease's fence (never after the lease was lost), so an effect written
    /// this way is committed once. See [`Effect`](lease_core::Effect); the Postgres adapter builds
    /// them (`PgEffect`).
    ///
    /// If the effect fails when the batch runs it, it is rolled back alone and the attempt
    /// counts as failed (retried under the [`RetryPolicy`](crate::RetryPolicy), failed at the
    /// last), while the other jobs of the batch commit. The effect goes with whatever end the
    /// handler returns ([`End::Complete`] usually), but not with [`End::Committed`] (the
    /// handler ended the lease itself: the effect is dropped, with a warning), nor when the
    /// handler fails or panics (the attempt failed: nothing of it commits). A second call
    /// replaces the first.
    ///
    /// # Errors
    /// [`InvalidInput::Effects`](lease_core::InvalidInput::Effects) when the worker's store cannot
    /// apply this effect (another backend's, or a store without effects), before anything
    /// runs: return it with `?` and the attempt fails with that reason.
    pub fn set_effect(&self, effect: impl Into<lease_core::Effect>) -> Result<()> {
        let effect = effect.into();
        if !self.store().takes_effect(&effect) {
            return Err(lease_core::InvalidInput::Effects {
                why: "the worker's store cannot apply this effect (built for another backend, or \
                      the store has no effects)",
            }
            .into());
        }
        *self.effect.lock().unwrap_or_else(|e| e.into_inner()) = Some(effect);
        Ok(())
    }

    /// The token of the wait this run begins by returning
    /// [`End::await_signal`]`(name, …)`: hand it to whoever answers (a link in an e-mail, a
    /// webhook's URL), who presents it to [`signal`](lease_core::SignalExt::signal). It names
    /// the run, the signal and this lease's fence, so it answers that wait only: not an
    /// earlier or a later one. Signed when the store has a [`SignalKey`](lease_core::SignalKey).
    /// Made here, with no call to the store.
    ///
    /// # Errors
    /// The [`SignalName`](lease_core::SignalName) rule's.
    pub fn signal_token(&self, name: &str) -> Result<lease_core::SignalToken> {
        Ok(lease_core::SignalToken::for_lease(
            &self.scope.lease(),
            name,
            self.store().signal_key(),
        )?)
    }

    /// The signal `name` that answered the run's last wait, with its payload and when it
    /// arrived: what a handler resumed from [`End::await_signal`] reads. `None` when the run
    /// did not wait for `name` last, or the wait [timed out](RunContext::wait_timed_out) or was
    /// ended by an operator's resume. Kept by the attempts after it (a retry reads it again)
    /// until the run waits again.
    pub fn signal(&self, name: &str) -> Option<lease_core::Signal> {
        self.resumed()?
            .signal()
            .filter(|s| s.name.as_str() == name)
            .cloned()
    }

    /// Whether the run's last wait, for `name`, ended because its timeout passed.
    pub fn wait_timed_out(&self, name: &str) -> bool {
        matches!(
            self.resumed(),
            Some(lease_core::WaitEnd::TimedOut { name: n, .. }) if n.as_str() == name
        )
    }

    /// How the run's last wait ended, if it waited ([`Lease::resumed`]).
    pub fn resumed(&self) -> Option<lease_core::WaitEnd> {
        self.scope.lease().resumed().cloned()
    }

    /// The store, for an adapter's own fenced writes (present [`RunContext::lease`]).
    pub fn store(&self) -> &Arc<dyn LeaseStore> {
        self.scope.store()
    }
}

impl fmt::Debug for RunContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunContext")
            .field("run", self.run())
            .field("fence", &self.fence())
            .finish_non_exhaustive()
    }
}

/// A boxed handler future.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<End, BoxError>> + Send>>;

/// The work a [`Worker`](crate::Worker) runs for each claimed run. Implemented for every
/// `Fn(RunContext) -> impl Future<Output = Result<End, BoxError>>`.
///
/// An `Err` (or a panic) is a failed attempt: the run is retried after the
/// [`RetryPolicy`](crate::RetryPolicy)'s delay, or failed at its last attempt.
pub trait Handler: Send + Sync + 'static {
    /// Runs the job; returns how its lease ends.
    fn call(&self, ctx: RunContext) -> HandlerFuture;
}

impl<F, Fut> Handler for F
where
    F: Fn(RunContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<End, BoxError>> + Send + 'static,
{
    fn call(&self, ctx: RunContext) -> HandlerFuture {
        Box::pin(self(ctx))
    }
}

/// The end of one lease as the store decided it, handed to [`Worker::on_end`](crate::Worker::on_end) observers after
/// the batch that carried it returned.
#[derive(Debug)]
#[non_exhaustive]
pub struct EndReport<'a> {
    /// The lease that ended (or failed to).
    pub lease: &'a Lease,
    /// What the worker asked for.
    pub end: &'a End,
    /// `Ok(())` once the end is committed; otherwise the store's verdict or the last failure.
    pub result: &'a Result<()>,
    /// Whether the handler asked for this end (`false`: the worker released the run because
    /// the handler failed, panicked, or outlived the shutdown grace).
    pub by_handler: bool,
}

pub(super) type Observer = Arc<dyn Fn(&EndReport<'_>) + Send + Sync>;

/// Totals of a [`Worker::run`](crate::Worker::run).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerReport {
    /// Leases claimed.
    pub claimed: u64,
    /// Handlers started.
    pub started: u64,
    /// Runs completed (with or without an effect), counted after their batch committed.
    pub completed: u64,
    /// Runs released, by their handler's choice, its failure (with a retry delay), or the
    /// shutdown.
    pub released: u64,
    /// Runs suspended.
    pub suspended: u64,
    /// Runs given up on (failed): by their handler's choice ([`End::Fail`](lease_core::End::Fail)),
    /// or because their handler failed at the last attempt the
    /// [`RetryPolicy`](crate::RetryPolicy) allows.
    pub gave_up: u64,
    /// Handlers that returned an error or panicked (their runs retried later, or failed).
    pub handler_errors: u64,
    /// Handlers still running when the shutdown grace ended (cancelled, their runs released).
    pub abandoned: u64,
    /// Ends the store refused with a verdict (the lease was lost: someone else holds the run).
    pub refused: u64,
    /// Ends that could not be committed (the store stayed unavailable); those leases expire.
    pub failed: u64,
    /// Leases whose scope was cancelled before their handler could start (not run).
    pub not_started: u64,
    /// Runs claimed past their attempt budget and failed without running their handler
    /// (counted in `gave_up` too once the failure is committed).
    pub exhausted: u64,
    /// Attempts that outlived their [deadline](crate::WorkerConfig::with_attempt_timeout).
    pub timed_out: u64,
    /// `claim_next` calls that found nothing.
    pub empty_polls: u64,
    /// Idle waits ended by a wake-up from the store ([`LeaseStore::wakes`](lease_core::LeaseStore::wakes))
    /// rather than by the fallback poll.
    pub wake_ups: u64,
    /// `end_many` round trips.
    pub batches: u64,
    /// Ended runs this worker purged while it held the purge lease
    /// ([retention](crate::WorkerConfig::with_retention)).
    pub purged: u64,
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) claimed: AtomicU64,
    pub(super) started: AtomicU64,
    pub(super) completed: AtomicU64,
    pub(super) released: AtomicU64,
    pub(super) suspended: AtomicU64,
    pub(super) gave_up: AtomicU64,
    pub(super) handler_errors: AtomicU64,
    pub(super) abandoned: AtomicU64,
    pub(super) refused: AtomicU64,
    pub(super) failed: AtomicU64,
    pub(super) not_started: AtomicU64,
    pub(super) exhausted: AtomicU64,
    pub(super) timed_out: AtomicU64,
    pub(super) empty_polls: AtomicU64,
    pub(super) wake_ups: AtomicU64,
    pub(super) batches: AtomicU64,
}

impl Counters {
    pub(super) fn report(&self) -> WorkerReport {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        WorkerReport {
            claimed: get(&self.claimed),
            started: get(&self.started),
            completed: get(&self.completed),
            released: get(&self.released),
            suspended: get(&self.suspended),
            gave_up: get(&self.gave_up),
            handler_errors: get(&self.handler_errors),
            abandoned: get(&self.abandoned),
            refused: get(&self.refused),
            failed: get(&self.failed),
            not_started: get(&self.not_started),
            exhausted: get(&self.exhausted),
            timed_out: get(&self.timed_out),
            empty_polls: get(&self.empty_polls),
            wake_ups: get(&self.wake_ups),
            batches: get(&self.batches),
            purged: 0,
        }
    }
}

pub(super) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}
