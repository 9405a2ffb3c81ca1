//! A fault-injecting wrapper over any `LeaseStore`, for partition tests and the demo.

use std::fmt;
use std::sync::Arc;

use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::id::{RunId, WorkerId};
use crate::store::LeaseStore;
use crate::types::{JournalEntry, Lease, ListFilter, RunRecord, Ttl};

/// What a [`FaultyStore`] does to the calls passing through it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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

/// The backend name of the errors a [`FaultyStore`] injects.
pub const FAULT_BACKEND: &str = "fault-injection";

/// Wraps a [`LeaseStore`] and injects [`Fault`]s into every call, so partition behaviour can be
/// tested in one process. Clones share the same fault switch.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::sync::Arc;
/// use lease_core::{Error, Fault, FaultyStore, LeaseStore, MemoryLeaseStore, RunId};
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
}

impl FaultyStore {
    /// Wraps `inner`, passing calls through until told otherwise.
    pub fn new(inner: Arc<dyn LeaseStore>) -> FaultyStore {
        FaultyStore {
            inner,
            fault: Arc::new(watch::Sender::new(Fault::Pass)),
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
        self.inner.create(run).await
    }

    async fn claim(&self, run: &RunId, worker: &WorkerId, ttl: Ttl) -> Result<Lease> {
        self.gate().await?;
        self.inner.claim(run, worker, ttl).await
    }

    async fn claim_next(&self, worker: &WorkerId, ttl: Ttl, max: usize) -> Result<Vec<Lease>> {
        self.gate().await?;
        self.inner.claim_next(worker, ttl, max).await
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease> {
        self.gate().await?;
        self.inner.renew(lease).await
    }

    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        self.gate().await?;
        self.inner.renew_many(leases).await
    }

    async fn append(&self, lease: &Lease, payload: &[u8]) -> Result<JournalEntry> {
        self.gate().await?;
        self.inner.append(lease, payload).await
    }

    async fn journal(&self, run: &RunId) -> Result<Vec<JournalEntry>> {
        self.gate().await?;
        self.inner.journal(run).await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.gate().await?;
        self.inner.release(lease).await
    }

    async fn suspend(&self, lease: &Lease) -> Result<()> {
        self.gate().await?;
        self.inner.suspend(lease).await
    }

    async fn resume(&self, run: &RunId) -> Result<RunRecord> {
        self.gate().await?;
        self.inner.resume(run).await
    }

    async fn complete(&self, lease: &Lease) -> Result<()> {
        self.gate().await?;
        self.inner.complete(lease).await
    }

    async fn inspect(&self, run: &RunId) -> Result<RunRecord> {
        self.gate().await?;
        self.inner.inspect(run).await
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<RunRecord>> {
        self.gate().await?;
        self.inner.list(filter).await
    }

    async fn force_release(&self, run: &RunId) -> Result<RunRecord> {
        self.gate().await?;
        self.inner.force_release(run).await
    }
}
