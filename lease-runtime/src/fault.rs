//! A fault-injecting wrapper over any `LeaseStore`, for partition tests and the demo.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_core::{
    Ending, Error, IdempotencyKey, JournalEntry, Lease, LeaseStore, ListFilter, Result, RunId,
    RunRecord, Ttl, WorkerId,
};
use tokio::sync::watch;

/// What a [`FaultyStore`] does to the calls passing through it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fault {
    /// Calls go through untouched.
    Pass,
    /// Calls wait, as over a black-holed network, until the fault changes. When it changes back
    /// to [`Fault::Pass`] the waiting calls are delivered, late, like retransmitted packets after
    /// a partition heals; under [`Fault::Fail`] they fail.
    Hang,
    /// Calls fail at once with [`Error::Unavailable`], as on a refused connection.
    Fail,
}

/// What a [`FaultyStore`] does to a call's reply **after the wrapped store applied the call**:
/// the faults of a network that delivered the request and then failed the answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReplyFault {
    /// Replies come back untouched.
    Pass,
    /// Each reply arrives this much later than the store answered (the call was applied at
    /// once): a slow answer, as after a retransmission.
    Delay(Duration),
    /// The call is applied and its reply never arrives: the caller's future never completes.
    Lose,
    /// The call is applied and the caller gets [`Error::Unavailable`], as when the connection
    /// drops between the store's commit and its reply.
    Error,
    /// The request is delivered twice: the store applies it twice and the caller gets the first
    /// reply.
    Duplicate,
}

/// The backend name of the errors a [`FaultyStore`] injects.
pub const FAULT_BACKEND: &str = "fault-injection";

/// Wraps a [`LeaseStore`] and injects [`Fault`]s into every call before it reaches the store,
/// and [`ReplyFault`]s into every reply after the store applied it, so partition behaviour can
/// be tested in one process. It also counts the renewals of each run it receives
/// ([`renewals_of`](FaultyStore::renewals_of)), whatever becomes of them, so a test can see a
/// heartbeat that should have stopped. Clones share the switches and the counts.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::sync::Arc;
/// use lease_core::{Error, LeaseStore, RunId};
/// use lease_runtime::{Fault, FaultyStore, MemoryLeaseStore};
/// let store = FaultyStore::new(Arc::new(MemoryLeaseStore::new()));
/// store.set(Fault::Fail);
/// let err = store.inspect(&RunId::new("r").unwrap()).await.unwrap_err();
/// assert!(err.is_retryable());
/// # }
/// ```
#[derive(Clone)]
pub struct FaultyStore {
    inner: Arc<dyn LeaseStore>,
    fault: Arc<watch::Sender<Fault>>,
    reply: Arc<Mutex<ReplyFault>>,
    renewals_by_run: Arc<Mutex<HashMap<RunId, u64>>>,
}

impl FaultyStore {
    /// Wraps `inner`, passing calls through until told otherwise.
    pub fn new(inner: Arc<dyn LeaseStore>) -> FaultyStore {
        FaultyStore {
            inner,
            fault: Arc::new(watch::Sender::new(Fault::Pass)),
            reply: Arc::new(Mutex::new(ReplyFault::Pass)),
            renewals_by_run: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Switches what happens to the replies of calls that reach the store from now on.
    pub fn set_reply(&self, fault: ReplyFault) {
        tracing::info!(store = %self.inner, ?fault, "reply fault injection switched");
        *self
            .reply
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = fault;
    }

    /// The current reply fault.
    pub fn reply_fault(&self) -> ReplyFault {
        *self
            .reply
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How many renewals of `run` were asked through this store (by `renew`, or as one lease
    /// of a `renew_many` batch), counted before any fault, including renewals the store refused.
    pub fn renewals_of(&self, run: &RunId) -> u64 {
        let counts = self
            .renewals_by_run
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        counts.get(run).copied().unwrap_or(0)
    }

    fn count_renewals<'a>(&self, leases: impl IntoIterator<Item = &'a Lease>) {
        let mut counts = self
            .renewals_by_run
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for lease in leases {
            *counts.entry(lease.run().clone()).or_default() += 1;
        }
    }

    /// Hands the reply `out` to the caller as the current reply fault says.
    async fn answer<T>(&self, fault: ReplyFault, out: Result<T>) -> Result<T> {
        match fault {
            ReplyFault::Pass | ReplyFault::Duplicate => out,
            ReplyFault::Delay(by) => {
                tokio::time::sleep(by).await;
                out
            }
            ReplyFault::Lose => std::future::pending().await,
            ReplyFault::Error => Err(Error::unavailable(
                FAULT_BACKEND,
                format!(
                    "injected loss of the reply from {} (the call was applied)",
                    self.inner
                ),
            )),
        }
    }

    /// Switches the fault for calls in flight and to come.
    pub fn set(&self, fault: Fault) {
        tracing::info!(store = %self.inner, ?fault, "fault injection switched");
        self.fault.send_replace(fault);
    }

    /// The current fault.
    pub fn fault(&self) -> Fault {
        *self.fault.borrow()
    }

    /// The wrapped store, reached without faults.
    pub fn inner(&self) -> &Arc<dyn LeaseStore> {
        &self.inner
    }

    /// Waits while hanging; fails under [`Fault::Fail`].
    async fn gate(&self) -> Result<()> {
        let mut fault = self.fault.subscribe();
        loop {
            match *fault.borrow_and_update() {
                Fault::Pass => return Ok(()),
                Fault::Fail => {
                    return Err(Error::unavailable(
                        FAULT_BACKEND,
                        format!("injected connection failure to {}", self.inner),
                    ))
                }
                Fault::Hang => {}
            }
            // The sender lives as long as `self`, so this only returns on a change.
            let _ = fault.changed().await;
        }
    }
}

impl fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyStore")
            .field("inner", &self.inner)
            .field("fault", &self.fault())
            .field("reply", &self.reply_fault())
            .finish()
    }
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "faulty({})", self.inner)
    }
}

#[async_trait::async_trait]
impl LeaseStore for FaultyStore {
    async fn create(&self, run: &RunId) -> Result<RunRecord> {
        self.gate().await?;
        let fault = self.reply_fault();
        if fault == ReplyFault::Duplicate {
            let _ = self.inner.create(run).await;
        }
        let out = self.inner.create(run).await;
        self.answer(fault, out).await
    }

    async fn claim(&self, run: &RunId, worker: &WorkerId, ttl: Ttl) -> Result<Lease> {
        self.gate().await?;
        let fault = self.reply_fault();
        if fault == ReplyFault::Duplicate {
            let _ = self.inner.claim(run, worker, ttl).await;
        }
        let out = self.inner.claim(run, worker, ttl).await;
        self.answer(fault, out).await
    }

    async fn claim_next(&self, worker: &WorkerId, ttl: Ttl, max: usize) -> Result<Vec<Lease>> {
        self.gate().await?;
        let fault = self.reply_fault();
        if fault == ReplyFault::Duplicate {
            let _ = self.inner.claim_next(worker, ttl, max).await;
        }
        let out = self.inner.claim_next(worker, ttl, max).await;
        self.answer(fault, out).await
    }

    async fn claim_next_kind(
        &self,
        kind: &lease_core::Kind,
        worker: &WorkerId,
        ttl: Ttl,
        max: usize,
    ) -> Result<Vec<Lease>> {
        self.gate().await?;
        let fault = self.reply_fault();
        if fault == ReplyFault::Duplicate {
            let _ = self.inner.claim_next_kind(kind, worker, ttl, max).await;
        }
        let out = self.inner.claim_next_kind(kind, worker, ttl, max).await;
        self.answer(fault, out).await
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease> {
        self.count_renewals([lease]);
        self.gate().await?;
        let fault = self.reply_fault();
        if fault == ReplyFault::Duplicate {
            let _ = self.inner.renew(lease).await;
        }
        let out = self.inner.renew(lease).await;
        self.answer(fault, out).await
    }

    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        self.count_renewals(leases);
        self.gate().await?;
        let fault = self.reply_fault();
        if fault == ReplyFault::Duplicate {
            let _ = self.inner.renew_many(leases).await;
        }
        let out = self.inner.renew_many(leases).await;
        self.answer(fault, out).await
    }

    async fn append(&self, lease: &Lease, payload: &[u8]) -> Result<JournalEntry> {
        self.gate().await?;
        let fault = self.reply_fault();
        if fault == ReplyFault::Duplicate {
            let _ = self.inner.append(lease, payload).await;
        }
        let out = self.inner.append(lease, payload).await;
        self.answer(fault, out).await
    }

    async fn append_keyed(
        &self,
        lease: &Lease,
        key: &IdempotencyKey,
        payload: &[u8],
    ) -> Result<JournalEntry> {
        self.gate().await?;
        let fault = self.reply_fault();
        if fault == ReplyFault::Duplicate {
            let _ = self.inner.append_keyed(lease, key, payload).await;
        }
        let out = self.inner.append_keyed(lease, key, payload).await;
        self.answer(fault, out).await
    }

    async fn journal(&self, run: &RunId) -> Result<Vec<JournalEntry>> {
        self.gate().await?;
        let fault = self.reply_fault();
        if fault == ReplyFault::Duplicate {
            let _ = self.inner.journal(run).await;
        }
        let out = self.inner.journal(run).await;
        self.answer(fault, out).await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.gate().await?;
        let fault = self.reply_fault();
        if fault == ReplyFault::Duplicate {
            let _ = self.inner.release(lease).await;
        }
        let out = self.inner.release(lease).await;
        self.answer(fault, out).await
    }

    async fn suspend(&self, lease: &Lease) -> Result<()> {
        self.gate().await?;
        let fault = self.reply_fault();
        if fault == ReplyFault::Duplicate {
            let _ = self.inner.suspend(lease).await;
        }
        let out = self.inner.suspend(lease).await;
        self.answer(fault, out).await
    }

    async fn end_many(&self, ends: &[Ending]) -> Result<Vec<Result<()>>> {
        self.gate().await?;
        let fault = self.reply_fault();
        if fault == ReplyFault::Duplicate {
            let _ = self.inner.end_many(ends).await;
        }
        let out = self.inner.end_many(ends).await;
        self.answer(fault, out).await
    }

    fn takes_effect(&self, effect: &lease_core::Effect) -> bool {
        self.inner.takes_effect(effect)
    }

    async fn end_many_with_effects(
        &self,
        ends: &[Ending],
        effects: &[Option<lease_core::Effect>],
    ) -> Result<Vec<Result<()>>> {
        self.gate().await?;
        let fault = self.reply_fault();
        if fault == ReplyFault::Duplicate {
            let _ = self.inner.end_many_with_effects(ends, effects).await;
        }
        let out = self.inner.end_many_with_effects(ends, effects).await;
        self.answer(fault, out).await
    }

    async fn create_many(&self, runs: &[RunId]) -> Result<Vec<Result<()>>> {
        self.gate().await?;
        let fault = self.reply_fault();
        if fault == ReplyFault::Duplicate {
            let _ = self.inner.create_many(runs).await;
        }
        let out = self.inner.create_many(runs).await;
        self.answer(fault, out).await
    }

    async fn create_with(&self, new: &lease_core::NewRun) -> Result<RunRecord> {
        self.gate().await?;
        let fault = self.reply_fault();
        if fault == ReplyFault::Duplicate {
            let _ = self.inner.create_with(new).await;
        }
        let out = self.inner.create_with(new).await;
        self.answer(fault, out).await
    }

    async fn create_many_with(&self, runs: &[lease_core::NewRun]) -> Result<Vec<Result<()>>> {
        self.gate().await?;
        let fault = self.reply_fault();
        if fault == ReplyFault::Duplicate {
            let _ = self.inner.create_many_with(runs).await;
        }
        let out = self.inner.create_many_with(runs).await;
        self.answer(fault, out).await
    }

    async fn resume(&self, run: &RunId) -> Result<RunRecord> {
        self.gate().await?;
        let fault = self.reply_fault();
        if fault == ReplyFault::Duplicate {
            let _ = self.inner.resume(run).await;
        }
        let out = self.inner.resume(run).await;
        self.answer(fault, out).await
    }

    async fn complete(&self, lease: &Lease) -> Result<()> {
        self.gate().await?;
        let fault = self.reply_fault();
        if fault == ReplyFault::Duplicate {
            let _ = self.inner.complete(lease).await;
        }
        let out = self.inner.complete(lease).await;
        self.answer(fault, out).await
    }

    async fn inspect_many(&self, runs: &[RunId]) -> Result<Vec<Result<RunRecord>>> {
        self.gate().await?;
        let fault = self.reply_fault();
        if fault == ReplyFault::Duplicate {
            let _ = self.inner.inspect_many(runs).await;
        }
        let out = self.inner.inspect_many(runs).await;
        self.answer(fault, out).await
    }

    async fn inspect(&self, run: &RunId) -> Result<RunRecord> {
        self.gate().await?;
        let fault = self.reply_fault();
        if fault == ReplyFault::Duplicate {
            let _ = self.inner.inspect(run).await;
        }
        let out = self.inner.inspect(run).await;
        self.answer(fault, out).await
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<RunRecord>> {
        self.gate().await?;
        let fault = self.reply_fault();
        if fault == ReplyFault::Duplicate {
            let _ = self.inner.list(filter).await;
        }
        let out = self.inner.list(filter).await;
        self.answer(fault, out).await
    }

    async fn force_release(&self, run: &RunId) -> Result<RunRecord> {
        self.gate().await?;
        let fault = self.reply_fault();
        if fault == ReplyFault::Duplicate {
            let _ = self.inner.force_release(run).await;
        }
        let out = self.inner.force_release(run).await;
        self.answer(fault, out).await
    }

    async fn cancel(&self, run: &RunId, reason: &str) -> Result<RunRecord> {
        self.gate().await?;
        let fault = self.reply_fault();
        if fault == ReplyFault::Duplicate {
            let _ = self.inner.cancel(run, reason).await;
        }
        let out = self.inner.cancel(run, reason).await;
        self.answer(fault, out).await
    }

    async fn purge(&self, older_than: Duration, max: usize) -> Result<Vec<RunId>> {
        self.gate().await?;
        let fault = self.reply_fault();
        if fault == ReplyFault::Duplicate {
            let _ = self.inner.purge(older_than, max).await;
        }
        let out = self.inner.purge(older_than, max).await;
        self.answer(fault, out).await
    }

    async fn purge_ended(
        &self,
        states: lease_core::EndedStates,
        older_than: Duration,
        max: usize,
    ) -> Result<Vec<RunId>> {
        self.gate().await?;
        let fault = self.reply_fault();
        if fault == ReplyFault::Duplicate {
            let _ = self.inner.purge_ended(states, older_than, max).await;
        }
        let out = self.inner.purge_ended(states, older_than, max).await;
        self.answer(fault, out).await
    }

    async fn purge_ids(&self, runs: &[RunId]) -> Result<Vec<RunId>> {
        self.gate().await?;
        let fault = self.reply_fault();
        if fault == ReplyFault::Duplicate {
            let _ = self.inner.purge_ids(runs).await;
        }
        let out = self.inner.purge_ids(runs).await;
        self.answer(fault, out).await
    }

    async fn count_purgeable(&self, older_than: Duration) -> Result<u64> {
        self.gate().await?;
        let fault = self.reply_fault();
        let out = self.inner.count_purgeable(older_than).await;
        self.answer(fault, out).await
    }

    async fn count(&self) -> Result<lease_core::RunCounts> {
        self.gate().await?;
        let fault = self.reply_fault();
        let out = self.inner.count().await;
        self.answer(fault, out).await
    }

    async fn count_kinds(&self) -> Result<Vec<lease_core::KindCounts>> {
        self.gate().await?;
        let fault = self.reply_fault();
        let out = self.inner.count_kinds().await;
        self.answer(fault, out).await
    }

    fn wakes(&self) -> Option<lease_core::Wakes> {
        self.inner.wakes()
    }
}
