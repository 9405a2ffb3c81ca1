//! How to write a new [`LeaseStore`] backend, in code.
//!
//! `AuditedStore` below is a complete backend: it keeps its runs in a [`MemoryLeaseStore`]
//! (stand-in for your storage) and adds an **audit trail of every fenced write**: how many
//! were accepted, how many were refused and why, and the last refusals with the fence they
//! presented. It passes the whole conformance suite, which is what makes it a backend and not
//! just a type that implements the trait:
//!
//! ```sh
//! cargo run  -p distribution --example custom_backend   # the audit trail of a fenced-out write
//! cargo test -p distribution --example custom_backend   # every conformance scenario against it
//! ```
//!
//! A store that only wraps another (to count, trace or fault its calls) need not forward
//! each method by hand: [`lease_core::forward::Forward`] forwards every one through a single
//! hook, as the runtime's `Instrumented` and `FaultyStore` do.
//!
//! The page for backend authors is `lease-conformance/README.md` (how to run the suite on your
//! own crate); the shared checks, verdict rules and the trait's evolution policy are in
//! [`lease_core::backend`]. This file is the worked example both of them point to.
//!
//! # 1. The contract: what each part of the trait requires
//!
//! [`LeaseStore`]'s documentation is the contract; each method says what it must accept,
//! refuse, and with which [`Error`]. The rules that hold for all of them:
//!
//! - **Atomic, in the store.** Every check and the write it guards happen in one step of
//!   your storage: one conditional statement, one transaction, one script, one lock. A check
//!   in the client followed by a write is a race, not a backend.
//! - **The store's clock only.** Expiry (`claim`, `claim_next`, `renew`, `count`, `purge`,
//!   retry delays) is judged on the clock of the storage itself (`now()` in SQL, `TIME` in a
//!   Redis script, the memory store's monotonic clock). Never send the worker's time.
//! - **Claims** (`claim`, `claim_next`) succeed only on a runnable run that is unowned or
//!   expired and not delayed, and **increment the fence**: it never decreases and never
//!   repeats, so it is also the attempt number. A refused claim says why
//!   ([`claim_refusal`](lease_core::backend::claim_refusal) picks the reason in the required
//!   order). `claim_next` never hands one run to two callers under one fence.
//! - **Fenced writes** (`renew`, `renew_many`, `append`, `append_keyed`, `release`,
//!   `suspend`, `complete`, every item of `end_many`, and any write of your own such as a
//!   transaction or a script) are accepted iff the presented fence equals the stored one and
//!   the lease is held. Otherwise `NotFound`, then `StaleFence { presented, current }` for a
//!   lower fence, `FenceAhead` for a higher one, `LeaseEnded` for an equal fence whose lease
//!   ended: exactly what [`fenced_verdict`](lease_core::backend::fenced_verdict) answers from
//!   the row you read back when a conditional write matched nothing. **Expiry alone never
//!   refuses a write**: only a reclaim moves the fence.
//! - **Batches** (`renew_many`, `end_many`, `create_many`, `inspect_many`) answer one result
//!   per item, in order, each judged on its own; `end_many` is one commit for the batch. The
//!   outer error is only for a batch that could not be decided at all.
//! - **Retries apply once.** A retried end that was applied answers `LeaseEnded` with the
//!   caller's own fence; `append_keyed` answers the first entry written with its key.
//! - **Durability.** A fence may never be issued twice: refuse, at connect, a configuration
//!   in which an acknowledged claim can be lost (see ARCHITECTURE.md, "How a backend carries out the contract").
//! - **Retention** (`purge`) deletes the run and raises a per-store fence floor to its fence;
//!   every run is created at the floor, so a run created again under the same id starts
//!   above every fence it ever issued.
//! - **Cancel safety.** A dropped call may or may not have applied; an applied claim the
//!   caller never saw expires by its TTL.
//!
//! # 2. The helpers in [`lease_core::backend`]
//!
//! Check input before any I/O with its `check_*` functions (`check_claim_max`,
//! `check_end_batch`, `check_payload`, …) so every backend refuses the same input with the
//! same [`InvalidInput`](lease_core::InvalidInput); build answers with
//! [`RunRecord::new`](lease_core::RunRecord::new), [`JournalEntry::new`](lease_core::JournalEntry::new)
//! and [`Lease::new`]. `AuditedStore` needs none of them only because the store it wraps
//! already applies them.
//!
//! # 3. Implement every method, including the defaulted ones
//!
//! Methods added to the trait after 0.1 come with a default that refuses
//! (`purge`, `count`, `count_kinds`, `count_purgeable`, `append_keyed` answer
//! [`Unsupported`](lease_core::InvalidInput::Unsupported)) or loops (`inspect_many` calls
//! `inspect` once per run). A wrapper that forgets one silently turns a working operation of
//! the store it wraps into a refusal or a slow loop, so this impl denies
//! `clippy::missing_trait_methods`: a method added to the trait later fails the lint here
//! until it is forwarded. The enums you match (`End`, `RunState`, `Ended`) are
//! `#[non_exhaustive]`: refuse what you do not know (`Unsupported`), never guess.
//!
//! # 4. Prove it with the conformance suite
//!
//! Hand the suite a [`StoreFactory`](lease_conformance::StoreFactory) whose `fresh()` returns
//! a store over its own empty namespace, and expand `conformance_tests!` (see the
//! `conformance` module at the bottom): one `#[tokio::test]` per scenario, each asserting the
//! reason of every refusal. Passing all of them is the definition of a correct backend.

use std::collections::BTreeMap;
use std::fmt;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use lease_core::{
    Ending, Error, IdempotencyKey, JournalEntry, Lease, LeaseStore, LeaseStoreExt, ListFilter,
    Result, RunCounts, RunId, RunRecord, RunState, Ttl, WorkerId,
};
use lease_runtime::{observe, MemoryLeaseStore};

/// How many refusals the audit trail keeps (the oldest go first).
const KEEP_REFUSALS: usize = 100;

/// A [`LeaseStore`] that keeps its runs in a [`MemoryLeaseStore`] and audits every fenced
/// write: accepted, or refused with the store's reason.
///
/// The audit is taken from the store's own verdicts, after the write was decided: it never
/// answers a write itself, so it cannot weaken the contract.
pub struct AuditedStore {
    inner: MemoryLeaseStore,
    audit: Mutex<Audit>,
}

/// What the audit trail holds.
#[derive(Clone, Debug, Default)]
pub struct Audit {
    /// Fenced writes the store accepted, by operation (`end_many` counts each item).
    pub accepted: BTreeMap<&'static str, u64>,
    /// Fenced writes the store refused, by reason (`stale_fence`, `lease_ended`, …).
    pub refused: BTreeMap<&'static str, u64>,
    /// The last refusals, oldest first.
    pub refusals: Vec<Refusal>,
}

/// One refused fenced write.
#[derive(Clone, Debug)]
pub struct Refusal {
    /// The operation (`append`, `renew`, `end_many`, …).
    pub operation: &'static str,
    /// The run written to.
    pub run: RunId,
    /// The worker that presented the lease.
    pub owner: WorkerId,
    /// The fence it presented.
    pub fence: u64,
    /// The store's reason ([`observe::reason`]).
    pub reason: &'static str,
}

impl AuditedStore {
    /// A new, empty store.
    pub fn new() -> AuditedStore {
        AuditedStore {
            inner: MemoryLeaseStore::new(),
            audit: Mutex::new(Audit::default()),
        }
    }

    /// A copy of the audit trail so far.
    pub fn audit(&self) -> Audit {
        self.lock().clone()
    }

    fn lock(&self) -> MutexGuard<'_, Audit> {
        // The audit is plain counters: a panic elsewhere cannot leave it inconsistent.
        self.audit.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the store's verdict on one fenced write under `lease`.
    fn record<T>(&self, operation: &'static str, lease: &Lease, result: &Result<T>) {
        let mut audit = self.lock();
        match result {
            Ok(_) => *audit.accepted.entry(operation).or_default() += 1,
            // Not a verdict (the store was unavailable, the input was refused): the write was
            // not decided, so there is nothing to audit.
            Err(e) if !e.is_verdict() => {}
            Err(e) => {
                let reason = observe::reason(e);
                *audit.refused.entry(reason).or_default() += 1;
                if audit.refusals.len() == KEEP_REFUSALS {
                    audit.refusals.remove(0);
                }
                audit.refusals.push(Refusal {
                    operation,
                    run: lease.run().clone(),
                    owner: lease.owner().clone(),
                    fence: lease.fence().get(),
                    reason,
                });
            }
        }
    }

    /// Records a batch: one verdict per item, or nothing if the batch was not decided.
    fn record_many<T>(
        &self,
        operation: &'static str,
        leases: impl Iterator<Item = Lease>,
        results: &Result<Vec<Result<T>>>,
    ) {
        if let Ok(items) = results {
            for (lease, item) in leases.zip(items) {
                self.record(operation, &lease, item);
            }
        }
    }
}

impl Default for AuditedStore {
    fn default() -> Self {
        AuditedStore::new()
    }
}

impl fmt::Debug for AuditedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuditedStore")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// `Display` names the store in logs and spans (`Instrumented`, the `Worker`'s span).
impl fmt::Display for AuditedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "audited({})", self.inner)
    }
}

// Every method is forwarded, the defaulted ones too: the lint makes a forgotten one an error.
#[deny(clippy::missing_trait_methods)]
#[async_trait::async_trait]
impl LeaseStore for AuditedStore {
    // --- runs and claims: not fenced (a claim *moves* the fence) ---------------------------

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
        self.inner.claim(run, worker, ttl).await
    }

    async fn claim_next(&self, worker: &WorkerId, ttl: Ttl, max: usize) -> Result<Vec<Lease>> {
        self.inner.claim_next(worker, ttl, max).await
    }

    async fn claim_next_kind(
        &self,
        kind: &lease_core::Kind,
        worker: &WorkerId,
        ttl: Ttl,
        max: usize,
    ) -> Result<Vec<Lease>> {
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

    // --- fenced writes: the store decides, the audit records its verdict -------------------

    async fn renew(&self, lease: &Lease) -> Result<Lease> {
        let result = self.inner.renew(lease).await;
        self.record("renew", lease, &result);
        result
    }

    async fn renew_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        let results = self.inner.renew_many(leases).await;
        self.record_many("renew", leases.iter().cloned(), &results);
        results
    }

    async fn append(&self, lease: &Lease, payload: &[u8]) -> Result<JournalEntry> {
        let result = self.inner.append(lease, payload).await;
        self.record("append", lease, &result);
        result
    }

    async fn append_keyed(
        &self,
        lease: &Lease,
        key: &IdempotencyKey,
        payload: &[u8],
    ) -> Result<JournalEntry> {
        let result = self.inner.append_keyed(lease, key, payload).await;
        self.record("append_keyed", lease, &result);
        result
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let result = self.inner.release(lease).await;
        self.record("release", lease, &result);
        result
    }

    async fn suspend(&self, lease: &Lease) -> Result<()> {
        let result = self.inner.suspend(lease).await;
        self.record("suspend", lease, &result);
        result
    }

    async fn complete(&self, lease: &Lease) -> Result<()> {
        let result = self.inner.complete(lease).await;
        self.record("complete", lease, &result);
        result
    }

    async fn end_many(&self, ends: &[Ending]) -> Result<Vec<Result<()>>> {
        let results = self.inner.end_many(ends).await;
        self.record_many("end_many", ends.iter().map(|e| e.lease.clone()), &results);
        results
    }

    // Defaulted in the trait (no effects): the inner store decides which it takes.
    fn takes_effect(&self, effect: &lease_core::Effect) -> bool {
        self.inner.takes_effect(effect)
    }

    async fn end_many_with_effects(
        &self,
        ends: &[Ending],
        effects: &[Option<lease_core::Effect>],
    ) -> Result<Vec<Result<()>>> {
        let results = self.inner.end_many_with_effects(ends, effects).await;
        self.record_many(
            "end_many_with_effects",
            ends.iter().map(|e| e.lease.clone()),
            &results,
        );
        results
    }

    // --- reads --------------------------------------------------------------------------------

    async fn journal(&self, run: &RunId) -> Result<Vec<JournalEntry>> {
        self.inner.journal(run).await
    }

    async fn inspect(&self, run: &RunId) -> Result<RunRecord> {
        self.inner.inspect(run).await
    }

    // Defaulted in the trait (a loop over `inspect`); the memory store reads all at once.
    async fn inspect_many(&self, runs: &[RunId]) -> Result<Vec<Result<RunRecord>>> {
        self.inner.inspect_many(runs).await
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<RunRecord>> {
        self.inner.list(filter).await
    }

    // Defaulted in the trait (`Unsupported`).
    async fn count(&self) -> Result<RunCounts> {
        self.inner.count().await
    }

    async fn count_kinds(&self) -> Result<Vec<lease_core::KindCounts>> {
        self.inner.count_kinds().await
    }

    // --- operator actions and retention -----------------------------------------------------

    async fn resume(&self, run: &RunId) -> Result<RunRecord> {
        self.inner.resume(run).await
    }

    // A signal is checked against the wait its token names, as a fenced write is against its
    // lease: the inner store judges it.
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

    // Defaulted in the trait (`Unsupported`).
    async fn cancel(&self, run: &RunId, reason: &str) -> Result<RunRecord> {
        self.inner.cancel(run, reason).await
    }

    // Defaulted in the trait (`Unsupported`).
    async fn purge(&self, older_than: Duration, max: usize) -> Result<Vec<RunId>> {
        self.inner.purge(older_than, max).await
    }

    // Defaulted in the trait (`Unsupported`).
    async fn purge_ids(&self, runs: &[RunId]) -> Result<Vec<RunId>> {
        self.inner.purge_ids(runs).await
    }

    // Defaulted in the trait (`purge` for every ended state, `Unsupported` for some).
    async fn purge_ended(
        &self,
        states: distribution::EndedStates,
        older_than: Duration,
        max: usize,
    ) -> Result<Vec<RunId>> {
        self.inner.purge_ended(states, older_than, max).await
    }

    // Defaulted in the trait (`Unsupported`).
    async fn count_purgeable(&self, older_than: Duration) -> Result<u64> {
        self.inner.count_purgeable(older_than).await
    }

    // Wake-ups are hints, not writes: no audit entry.
    fn wakes(&self) -> Option<lease_core::Wakes> {
        self.inner.wakes()
    }

    // What the store supports and how finely it times: the conformance suite reads it (and
    // skips only what a store says it lacks), as callers that adapt to the store do.
    fn capabilities(&self) -> lease_core::Capabilities {
        self.inner.capabilities()
    }
}

/// Worker A claims a run with a short TTL and writes; A "pauses" past its TTL; B reclaims the
/// run (the fence moves to 2) and completes it with its effect; A comes back and writes under
/// fence 1: refused with `StaleFence`, and the audit trail shows it.
#[tokio::main]
async fn main() -> ExitCode {
    match demo().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("custom_backend: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn demo() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let store = Arc::new(AuditedStore::new());
    let run = RunId::new("order-42")?;
    store.create(&run).await?;

    let a = store
        .claim(&run, &WorkerId::new("worker-a")?, Ttl::from_millis(100)?)
        .await?;
    store.append(&a, b"reserve stock").await?;
    println!("worker-a claimed {run} at fence {}", a.fence());

    // A stops renewing (paused). B polls the claim until the store's clock says A's lease
    // expired: the store answers `Held` with the time left until then.
    let b_id = WorkerId::new("worker-b")?;
    let b = loop {
        match store.claim(&run, &b_id, Ttl::from_secs(30)?).await {
            Ok(lease) => break lease,
            Err(Error::Held { remaining, .. }) => {
                tokio::time::sleep(
                    remaining.clamp(Duration::from_millis(1), Duration::from_millis(50)),
                )
                .await
            }
            Err(e) => return Err(e.into()),
        }
    };
    println!("worker-b reclaimed {run} at fence {}", b.fence());
    store.complete_with(&b, b"ship").await?;

    // A comes back and writes under its old fence.
    match store.append(&a, b"charge card").await {
        Err(Error::StaleFence {
            presented: 1,
            current: 2,
            ..
        }) => println!("worker-a's late write refused: stale fence 1 < 2"),
        other => return Err(format!("expected StaleFence {{ 1, 2 }}, got {other:?}").into()),
    }

    // The defaulted methods answer through the wrapper (they would be `Unsupported` if it
    // forgot to forward them).
    let counts = store.count().await?;
    let record = store.inspect(&run).await?;
    let journal = store.journal(&run).await?;
    let fences: Vec<u64> = journal.iter().map(|e| e.fence.get()).collect();
    if counts.completed != 1 || record.state != RunState::Completed || fences != [1, 2] {
        return Err(format!(
            "unexpected end state: {counts:?}, {:?}, journal fences {fences:?}",
            record.state
        )
        .into());
    }

    let audit = store.audit();
    println!("audit: accepted {:?}", audit.accepted);
    println!("audit: refused  {:?}", audit.refused);
    for r in &audit.refusals {
        println!(
            "audit: {} on {} by {} under fence {}: {}",
            r.operation, r.run, r.owner, r.fence, r.reason
        );
    }
    let accepted: u64 = audit.accepted.values().sum();
    if accepted != 2 || audit.refused.get("stale_fence") != Some(&1) || audit.refusals.len() != 1 {
        return Err(format!("the audit trail does not match the story: {audit:?}").into());
    }
    println!("ok: one effect per fence, the stale write refused and audited");
    Ok(())
}

/// The whole conformance suite against `AuditedStore`, one test per scenario:
/// `cargo test -p distribution --example custom_backend`.
#[cfg(test)]
mod conformance {
    use std::sync::Arc;

    use lease_conformance::StoreFactory;
    use lease_core::LeaseStore;

    use super::AuditedStore;

    struct Factory;

    #[async_trait::async_trait]
    impl StoreFactory for Factory {
        /// A store over its own empty namespace: here, simply a new store.
        async fn fresh(&self) -> Arc<dyn LeaseStore> {
            Arc::new(AuditedStore::new())
        }
    }

    /// `None` would skip every scenario (a fixture whose server is unavailable under an
    /// explicit opt-out); an in-process store is always there.
    async fn factory() -> Option<Arc<dyn StoreFactory>> {
        Some(Arc::new(Factory))
    }

    lease_conformance::conformance_tests!(factory());

    /// The demo in `main` is itself a check: it fails if the audit does not match the story.
    #[tokio::test]
    async fn the_demo_audits_the_stale_write() {
        super::demo().await.expect("the demo");
    }
}
