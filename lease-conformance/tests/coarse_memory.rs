//! Scenarios through a store that declares etcd-like capabilities (whole-second TTLs, at
//! least one second) over the memory store: the suite stretches its timings and still passes.
//!
//! The store is wrapped in [`Coarse`], which refuses every claim whose TTL the declared
//! capabilities say the store could not time (shorter than the minimum, or not a whole number
//! of seconds), so a scenario that ignored the capabilities fails here instead of passing on a
//! store that happens to time milliseconds. A handful of scenarios only: stretched, each takes
//! seconds. The chosen ones cover each kind of timing the suite derives: the short TTL and the
//! wait past it, a retry delay, a TTL-proportional scope (heartbeat, margin, hang), a late
//! reply, and a timing check made of fractions of the TTL; and a few model-check sequences.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lease_conformance::{Capabilities, StoreFactory};
use lease_core::{
    Ending, Error, IdempotencyKey, InvalidInput, JournalEntry, Lease, LeaseStore, ListFilter,
    Result, RunCounts, RunId, RunRecord, Ttl, WorkerId,
};
use lease_runtime::MemoryLeaseStore;

/// etcd's shape: whole-second leases of at least a second, found expired by a sweep every
/// 500 ms (the memory store is never late, so the lag only lengthens the waits here).
fn etcd_like() -> Capabilities {
    Capabilities::default()
        .with_min_ttl(Duration::from_secs(1))
        .with_ttl_granularity(Duration::from_secs(1))
        .with_max_expiry_lag(Duration::from_millis(500))
}

/// The memory store, refusing TTLs that `caps` says the store cannot time.
struct Coarse {
    inner: MemoryLeaseStore,
    caps: Capabilities,
}

impl Coarse {
    fn check(&self, ttl: Ttl) -> Result<()> {
        let d = ttl.as_duration();
        let step = self.caps.ttl_granularity.as_millis();
        if d < self.caps.min_ttl || d.as_millis() % step != 0 {
            // A typed refusal the scenario cannot mistake for a verdict: its unwrap names it.
            return Err(Error::InvalidInput(InvalidInput::TtlTooShort { ttl: d }));
        }
        Ok(())
    }
}

impl fmt::Debug for Coarse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Coarse").field("caps", &self.caps).finish()
    }
}

impl fmt::Display for Coarse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "memory (coarse TTLs: {:?})", self.caps)
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait::async_trait]
impl LeaseStore for Coarse {
    async fn create(&self, run: &RunId) -> Result<RunRecord> {
        self.inner.create(run).await
    }

    async fn create_many(&self, runs: &[RunId]) -> Result<Vec<Result<()>>> {
        self.inner.create_many(runs).await
    }

    async fn create_with(&self, new: &lease_core::NewRun) -> Result<RunRecord> {
        self.inner.create_with(new).await
    }

    async fn create_many_with(&self, runs: &[lease_core::NewRun]) -> Result<Vec<Result<()>>> {
        self.inner.create_many_with(runs).await
    }

    async fn claim(&self, run: &RunId, worker: &WorkerId, ttl: Ttl) -> Result<Lease> {
        self.check(ttl)?;
        self.inner.claim(run, worker, ttl).await
    }

    async fn claim_next(&self, worker: &WorkerId, ttl: Ttl, max: usize) -> Result<Vec<Lease>> {
        self.check(ttl)?;
        self.inner.claim_next(worker, ttl, max).await
    }

    async fn claim_next_kind(
        &self,
        kind: &lease_core::Kind,
        worker: &WorkerId,
        ttl: Ttl,
        max: usize,
    ) -> Result<Vec<Lease>> {
        self.check(ttl)?;
        self.inner.claim_next_kind(kind, worker, ttl, max).await
    }

    async fn claim_next_in(
        &self,
        queue: &lease_core::Queue,
        kind: &lease_core::Kind,
        worker: &WorkerId,
        ttl: Ttl,
        max: usize,
    ) -> Result<Vec<Lease>> {
        self.check(ttl)?;
        self.inner
            .claim_next_in(queue, kind, worker, ttl, max)
            .await
    }

    async fn pause_queue(&self, queue: &lease_core::Queue) -> Result<lease_core::QueueState> {
        self.inner.pause_queue(queue).await
    }

    async fn resume_queue(&self, queue: &lease_core::Queue) -> Result<lease_core::QueueState> {
        self.inner.resume_queue(queue).await
    }

    async fn queues(&self) -> Result<Vec<lease_core::QueueState>> {
        self.inner.queues().await
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

    async fn append_keyed(
        &self,
        lease: &Lease,
        key: &IdempotencyKey,
        payload: &[u8],
    ) -> Result<JournalEntry> {
        self.inner.append_keyed(lease, key, payload).await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.inner.release(lease).await
    }

    async fn suspend(&self, lease: &Lease) -> Result<()> {
        self.inner.suspend(lease).await
    }

    async fn complete(&self, lease: &Lease) -> Result<()> {
        self.inner.complete(lease).await
    }

    async fn end_many(&self, ends: &[Ending]) -> Result<Vec<Result<()>>> {
        self.inner.end_many(ends).await
    }

    fn takes_effect(&self, effect: &lease_core::Effect) -> bool {
        self.inner.takes_effect(effect)
    }

    async fn end_many_with_effects(
        &self,
        ends: &[Ending],
        effects: &[Option<lease_core::Effect>],
    ) -> Result<Vec<Result<()>>> {
        self.inner.end_many_with_effects(ends, effects).await
    }

    async fn journal(&self, run: &RunId) -> Result<Vec<JournalEntry>> {
        self.inner.journal(run).await
    }

    async fn inspect(&self, run: &RunId) -> Result<RunRecord> {
        self.inner.inspect(run).await
    }

    async fn inspect_many(&self, runs: &[RunId]) -> Result<Vec<Result<RunRecord>>> {
        self.inner.inspect_many(runs).await
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<RunRecord>> {
        self.inner.list(filter).await
    }

    async fn count(&self) -> Result<RunCounts> {
        self.inner.count().await
    }

    async fn count_kinds(&self) -> Result<Vec<lease_core::KindCounts>> {
        self.inner.count_kinds().await
    }

    async fn resume(&self, run: &RunId) -> Result<RunRecord> {
        self.inner.resume(run).await
    }

    async fn deliver_signal(
        &self,
        run: &RunId,
        name: &lease_core::SignalName,
        fence: lease_core::Fence,
        payload: &[u8],
    ) -> Result<lease_core::Signalled> {
        self.inner.deliver_signal(run, name, fence, payload).await
    }

    fn signal_key(&self) -> Option<&lease_core::SignalKey> {
        self.inner.signal_key()
    }

    async fn force_release(&self, run: &RunId) -> Result<RunRecord> {
        self.inner.force_release(run).await
    }
    async fn cancel(&self, run: &RunId, reason: &str) -> Result<RunRecord> {
        self.inner.cancel(run, reason).await
    }

    async fn purge(&self, older_than: Duration, max: usize) -> Result<Vec<RunId>> {
        self.inner.purge(older_than, max).await
    }

    async fn purge_ended(
        &self,
        states: lease_core::EndedStates,
        older_than: Duration,
        max: usize,
    ) -> Result<Vec<RunId>> {
        self.inner.purge_ended(states, older_than, max).await
    }

    async fn purge_ids(&self, runs: &[RunId]) -> Result<Vec<RunId>> {
        self.inner.purge_ids(runs).await
    }

    async fn count_purgeable(&self, older_than: Duration) -> Result<u64> {
        self.inner.count_purgeable(older_than).await
    }

    fn wakes(&self) -> Option<lease_core::Wakes> {
        self.inner.wakes()
    }

    fn capabilities(&self) -> Capabilities {
        self.caps
    }
}

struct CoarseFactory;

#[async_trait::async_trait]
impl StoreFactory for CoarseFactory {
    async fn fresh(&self) -> Arc<dyn LeaseStore> {
        Arc::new(Coarse {
            inner: MemoryLeaseStore::new(),
            caps: etcd_like(),
        })
    }
}

/// The wrapper really refuses what the store could not time, so passing below means the
/// scenarios asked only for TTLs it can.
#[tokio::test]
async fn the_coarse_store_refuses_a_ttl_it_cannot_time() {
    let store = CoarseFactory.fresh().await;
    let r = RunId::new("r").unwrap();
    store.create(&r).await.unwrap();
    let w = WorkerId::new("w").unwrap();
    for ms in [150, 999, 1_500] {
        let got = store.claim(&r, &w, Ttl::from_millis(ms).unwrap()).await;
        assert!(
            matches!(got, Err(Error::InvalidInput(InvalidInput::TtlTooShort { ttl })) if ttl.as_millis() == u128::from(ms)),
            "{ms} ms: {got:?}"
        );
    }
    store
        .claim(&r, &w, Ttl::from_secs(2).unwrap())
        .await
        .unwrap();
}

macro_rules! stretched {
    ($($scenario:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                lease_conformance::$scenario(&CoarseFactory).await;
            }
        )*
    };
}

stretched!(
    an_expired_lease_is_reclaimable_with_the_next_fence,
    a_write_under_a_lower_fence_is_rejected_with_both_fences,
    a_retry_delay_holds_the_run_back_on_the_store_clock,
    scope_heartbeats_keep_a_lease_past_its_ttl,
    scope_over_a_hanging_store_cancels_at_its_local_deadline_before_store_expiry,
    scope_timing_without_room_for_a_retry_is_refused,
    scope_deadline_counts_from_the_send_instant_of_a_late_renewal,
);

/// The model check reads the capabilities too: its short TTL, retry delays and `Advance` steps
/// stretch to whole seconds (the coarse store refuses anything else), and leases still expire
/// inside sequences. Few cases: each sequence now sleeps seconds.
#[test]
fn the_model_check_stretches_to_whole_second_ttls() {
    lease_conformance::model_check::run_model_check(Arc::new(CoarseFactory), 12);
}
