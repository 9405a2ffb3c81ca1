//! A test store shared by this crate's test files: the memory store behind only the required
//! calls of `LeaseStore` (and `cancel`), so every provided call runs the trait's default, with
//! a gate in front of `end_many`.

use std::sync::{Arc, Mutex};

use lease_core::{
    Ending, Error, JournalEntry, Lease, LeaseStore, ListFilter, Result, RunId, RunRecord, Ttl,
    WorkerId,
};
use lease_runtime::MemoryLeaseStore;

/// Decides an `end_many` call before the store sees it: `Some(error)` refuses it.
pub(crate) type Gate = Box<dyn Fn(&[Ending]) -> Option<Error> + Send + Sync>;

/// The memory store, with `end_many` passing through `gate` first: `Some(error)` answers the
/// call with it (nothing applied), `None` lets it through. Every batch it receives is recorded.
pub(crate) struct Gated {
    /// The memory store behind the gate.
    pub(crate) inner: MemoryLeaseStore,
    gate: Gate,
    /// Each `end_many` batch received, as (run, fence) pairs.
    pub(crate) batches: Mutex<Vec<Vec<(String, u64)>>>,
}

impl std::fmt::Debug for Gated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Gated")
    }
}

impl std::fmt::Display for Gated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("gated memory store")
    }
}

#[async_trait::async_trait]
impl LeaseStore for Gated {
    async fn create(&self, run: &RunId) -> Result<RunRecord> {
        self.inner.create(run).await
    }
    async fn claim(&self, run: &RunId, worker: &WorkerId, ttl: Ttl) -> Result<Lease> {
        self.inner.claim(run, worker, ttl).await
    }
    async fn claim_next(&self, worker: &WorkerId, ttl: Ttl, max: usize) -> Result<Vec<Lease>> {
        self.inner.claim_next(worker, ttl, max).await
    }
    async fn renew(&self, lease: &Lease) -> Result<Lease> {
        self.inner.renew(lease).await
    }
    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        self.inner.renew_many(leases).await
    }
    async fn append(&self, lease: &Lease, payload: &[u8]) -> Result<JournalEntry> {
        self.inner.append(lease, payload).await
    }
    async fn journal(&self, run: &RunId) -> Result<Vec<JournalEntry>> {
        self.inner.journal(run).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.inner.release(lease).await
    }
    async fn suspend(&self, lease: &Lease) -> Result<()> {
        self.inner.suspend(lease).await
    }
    async fn end_many(&self, ends: &[Ending]) -> Result<Vec<Result<()>>> {
        self.batches.lock().unwrap().push(
            ends.iter()
                .map(|e| (e.lease.run().to_string(), e.lease.fence().get()))
                .collect(),
        );
        if let Some(refusal) = (self.gate)(ends) {
            return Err(refusal);
        }
        self.inner.end_many(ends).await
    }
    async fn create_many(&self, runs: &[RunId]) -> Result<Vec<Result<()>>> {
        self.inner.create_many(runs).await
    }
    async fn resume(&self, run: &RunId) -> Result<RunRecord> {
        self.inner.resume(run).await
    }
    async fn complete(&self, lease: &Lease) -> Result<()> {
        self.inner.complete(lease).await
    }
    async fn inspect(&self, run: &RunId) -> Result<RunRecord> {
        self.inner.inspect(run).await
    }
    async fn list(&self, filter: &ListFilter) -> Result<Vec<RunRecord>> {
        self.inner.list(filter).await
    }
    async fn force_release(&self, run: &RunId) -> Result<RunRecord> {
        self.inner.force_release(run).await
    }
    async fn cancel(&self, run: &RunId, reason: &str) -> Result<RunRecord> {
        self.inner.cancel(run, reason).await
    }
}

pub(crate) fn gated(
    gate: impl Fn(&[Ending]) -> Option<Error> + Send + Sync + 'static,
) -> Arc<Gated> {
    Arc::new(Gated {
        inner: MemoryLeaseStore::new(),
        gate: Box::new(gate),
        batches: Mutex::new(Vec::new()),
    })
}
