//! The [`LeaseStore`] contract, each operation handed to the file of its concern.

use std::time::Duration;

use lease_core::backend::{check_end_batch, check_payload};
use lease_core::{
    End, Ending, IdempotencyKey, JournalEntry, Kind, Lease, LeaseStore, ListFilter, NewRun, Result,
    RunCounts, RunId, RunRecord, Ttl, WorkerId,
};

use super::{now_micros, EtcdLeaseStore};

#[async_trait::async_trait]
impl LeaseStore for EtcdLeaseStore {
    async fn create(&self, run: &RunId) -> Result<RunRecord> {
        self.create_with(&NewRun::new(run.clone())).await
    }

    async fn create_with(&self, new: &NewRun) -> Result<RunRecord> {
        // Unique keys and queues are not kept here yet: refused (after the input checks)
        // rather than ignored.
        new.check()?;
        lease_core::refuse_unique_keys([new])?;
        lease_core::refuse_queues([new.queue()])?;
        let created = self.create_batch(std::slice::from_ref(new)).await?;
        created.into_iter().next().expect("one result")?;
        self.inspect(new.run()).await
    }

    async fn create_many_with(&self, runs: &[NewRun]) -> Result<Vec<Result<()>>> {
        lease_core::backend::check_new_runs(runs)?;
        lease_core::refuse_unique_keys(runs)?;
        lease_core::refuse_queues(runs.iter().map(NewRun::queue))?;
        self.create_batch(runs).await
    }

    async fn claim(&self, run: &RunId, worker: &WorkerId, ttl: Ttl) -> Result<Lease> {
        self.claim_one(run, worker, ttl).await
    }

    async fn claim_next(&self, worker: &WorkerId, ttl: Ttl, max: usize) -> Result<Vec<Lease>> {
        self.claim_next_runs(&Kind::default(), worker, ttl, max)
            .await
    }

    async fn claim_next_kind(
        &self,
        kind: &Kind,
        worker: &WorkerId,
        ttl: Ttl,
        max: usize,
    ) -> Result<Vec<Lease>> {
        self.claim_next_runs(kind, worker, ttl, max).await
    }

    async fn renew(&self, lease: &Lease) -> Result<Lease> {
        self.renew_each(std::slice::from_ref(lease))
            .await?
            .pop()
            .expect("one result")
    }

    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        self.renew_batch(leases).await
    }

    async fn append(&self, lease: &Lease, payload: &[u8]) -> Result<JournalEntry> {
        check_payload(payload)?;
        self.append_entry(lease, None, payload).await
    }

    async fn append_keyed(
        &self,
        lease: &Lease,
        key: &IdempotencyKey,
        payload: &[u8],
    ) -> Result<JournalEntry> {
        check_payload(payload)?;
        self.append_entry(lease, Some(key), payload).await
    }

    async fn journal(&self, run: &RunId) -> Result<Vec<JournalEntry>> {
        self.journal_entries(run).await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.end_one(lease, End::Release).await
    }

    async fn suspend(&self, lease: &Lease) -> Result<()> {
        self.end_one(lease, End::Suspend).await
    }

    async fn end_many(&self, ends: &[Ending]) -> Result<Vec<Result<()>>> {
        check_end_batch(ends)?;
        // No signals here: a wait would need its deadline in the index families and a
        // compare of the wait in every signal's transaction (the closing note of issue 53).
        lease_core::signal::refuse_waits(ends)?;
        self.end_each(ends).await
    }

    async fn create_many(&self, runs: &[RunId]) -> Result<Vec<Result<()>>> {
        lease_core::backend::check_create_batch(runs)?;
        let runs: Vec<NewRun> = runs.iter().cloned().map(NewRun::new).collect();
        self.create_batch(&runs).await
    }

    async fn resume(&self, run: &RunId) -> Result<RunRecord> {
        self.resume_run(run).await
    }

    async fn complete(&self, lease: &Lease) -> Result<()> {
        self.end_one(lease, End::Complete).await
    }

    async fn inspect(&self, run: &RunId) -> Result<RunRecord> {
        let now = now_micros();
        let seen = self.read(&[run]).await?;
        self.records_with_payloads(&[run], &seen, now)
            .await?
            .pop()
            .expect("one record")
    }

    async fn inspect_many(&self, runs: &[RunId]) -> Result<Vec<Result<RunRecord>>> {
        self.inspect_batch(runs).await
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<RunRecord>> {
        self.list_runs(filter).await
    }

    async fn force_release(&self, run: &RunId) -> Result<RunRecord> {
        self.force_release_run(run).await
    }

    async fn cancel(&self, run: &RunId, reason: &str) -> Result<RunRecord> {
        self.cancel_run(run, reason).await
    }

    async fn purge(&self, older_than: Duration, max: usize) -> Result<Vec<RunId>> {
        self.purge_runs(lease_core::EndedStates::ALL, older_than, max)
            .await
    }

    async fn purge_ids(&self, runs: &[RunId]) -> Result<Vec<RunId>> {
        self.purge_ids_now(runs).await
    }

    async fn purge_ended(
        &self,
        states: lease_core::EndedStates,
        older_than: Duration,
        max: usize,
    ) -> Result<Vec<RunId>> {
        self.purge_runs(states, older_than, max).await
    }

    async fn count(&self) -> Result<RunCounts> {
        self.count_runs().await
    }

    async fn count_purgeable(&self, older_than: Duration) -> Result<u64> {
        self.count_purgeable_runs(older_than).await
    }

    fn wakes(&self) -> Option<lease_core::Wakes> {
        self.wake_ups()
    }

    /// Whole-second leases from 1 s, on etcd leases reused for up to a second (so a block
    /// outlives its TTL by up to a second more), expired by the leader's sweep up to about half
    /// a second late: declared as two seconds of expiry lag. No queue lag (etcd times no
    /// instants of its own), no counts by kind. A `run_at` is taken as a delay on this host's
    /// clock (`store/admin.rs`, `start_delay_ms`).
    fn capabilities(&self) -> lease_core::Capabilities {
        let caps = lease_core::Capabilities::default()
            .with_min_ttl(std::time::Duration::from_secs(1))
            .with_ttl_granularity(std::time::Duration::from_secs(1))
            .with_max_expiry_lag(std::time::Duration::from_secs(2))
            .without_queue_lag()
            .without_kind_counts()
            .without_queues()
            .without_signals();
        if self.listening.is_some() {
            caps
        } else {
            caps.without_wake_ups()
        }
    }
}
