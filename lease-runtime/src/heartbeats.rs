//! `Heartbeats`: one worker-wide heartbeat that renews every registered lease with
//! `renew_many`, a thousand per round trip, and routes each verdict to its own scope.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_core::{Error, InvalidInput, Lease, LeaseStore, MAX_BATCH};
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::scope::{CancelReason, Shared};

/// A worker-level heartbeat: every tick it renews the leases of all registered
/// [`RunScope`](crate::RunScope)s with [`LeaseStore::renew_many`], in chunks of at most
/// [`MAX_BATCH`] leases per round trip, instead of one renewal per scope.
///
/// Register a scope by building it with
/// [`ScopeConfig::with_heartbeats`](crate::ScopeConfig::with_heartbeats). Each chunk's *send*
/// instant is recorded, and each lease's result goes to its own scope:
///
/// - renewed: the scope's local deadline becomes send instant + TTL − margin, as with its own
///   heartbeat;
/// - a verdict ([`Error::StaleFence`] and the other refusals): that scope **alone** is cancelled
///   with [`CancelReason::Rejected`]; the rest of the batch carries on;
/// - a failed or hung round trip: nothing is extended. Each scope keeps its own deadline watch,
///   so it is cancelled at its local deadline even if the call never returns. A chunk that has
///   not answered by the next tick is abandoned and a fresh one is sent.
///
/// Scopes that end (suspended, completed, released, rejected, expired or dropped) leave the hub
/// on their own. The hub renews through the store it was built with, which must be the store of
/// every scope registered with it. Clones share one hub; its task stops when the last clone is
/// dropped, after which registered scopes are cancelled at their local deadlines.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use lease_core::{LeaseStore, RunId, Ttl, WorkerId};
/// use lease_runtime::{Heartbeats, MemoryLeaseStore, RunScope, ScopeConfig};
///
/// let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
/// let hub = Heartbeats::new(store.clone(), Duration::from_secs(10))?;
/// let worker = WorkerId::new("worker-a")?;
/// let config = ScopeConfig::default().with_heartbeats(hub.clone());
/// let run = RunId::new("order-42")?;
/// store.create(&run).await?;
/// let scope = RunScope::claim(store, &run, &worker, Ttl::from_secs(30)?, config).await?;
/// assert_eq!(hub.len(), 1);
/// scope.complete().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Heartbeats {
    hub: Arc<Hub>,
    _stop: Arc<DropGuard>,
}

/// What one tick of a [`Heartbeats`] hub did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TickReport {
    /// Leases the tick tried to renew.
    pub leases: usize,
    /// `renew_many` round trips sent (chunks of at most [`MAX_BATCH`]).
    pub round_trips: usize,
    /// Leases renewed.
    pub renewed: usize,
    /// Leases the store rejected; their scopes were cancelled.
    pub rejected: usize,
    /// Leases whose renewal failed without a verdict (a failed or hung chunk, or a per-lease
    /// failure); their deadlines were not extended.
    pub failed: usize,
    /// How long each round trip took, from send to answer (or to abandonment), in the order
    /// the answers arrived.
    pub latencies: Vec<Duration>,
    /// How long the whole tick took.
    pub elapsed: Duration,
}

/// Totals over a [`Heartbeats`] hub's life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeartbeatStats {
    /// Ticks run.
    pub ticks: u64,
    /// `renew_many` round trips sent.
    pub round_trips: u64,
    /// Leases renewed.
    pub renewed: u64,
    /// Leases rejected by the store.
    pub rejected: u64,
    /// Lease renewals that failed without a verdict.
    pub failed: u64,
}

pub(crate) struct Hub {
    store: Arc<dyn LeaseStore>,
    tick: Duration,
    next_id: AtomicU64,
    members: Mutex<HashMap<u64, Arc<Shared>>>,
    totals: Mutex<HeartbeatStats>,
    last: Mutex<Option<TickReport>>,
}

impl Heartbeats {
    /// A hub renewing through `store` every `tick`, and its task. Scopes registered with it must
    /// have `tick` shorter than their TTL minus margin (checked when they are built).
    ///
    /// Must be called inside a tokio runtime: it spawns the hub's task.
    ///
    /// # Errors
    /// [`InvalidInput::ScopeTiming`] for a zero `tick`.
    pub fn new(store: Arc<dyn LeaseStore>, tick: Duration) -> Result<Heartbeats, InvalidInput> {
        if tick.is_zero() {
            return Err(InvalidInput::ScopeTiming {
                ttl: Duration::ZERO,
                heartbeat: tick,
                margin: Duration::ZERO,
            });
        }
        let hub = Arc::new(Hub {
            store,
            tick,
            next_id: AtomicU64::new(0),
            members: Mutex::new(HashMap::new()),
            totals: Mutex::new(HeartbeatStats::default()),
            last: Mutex::new(None),
        });
        let stop = CancellationToken::new();
        tokio::spawn(run(hub.clone(), stop.clone()));
        Ok(Heartbeats {
            hub,
            _stop: Arc::new(stop.drop_guard()),
        })
    }

    /// How often the hub renews.
    pub fn tick(&self) -> Duration {
        self.hub.tick
    }

    /// The store the hub renews through.
    pub fn store(&self) -> &Arc<dyn LeaseStore> {
        &self.hub.store
    }

    /// How many scopes are registered.
    pub fn len(&self) -> usize {
        lock(&self.hub.members).len()
    }

    /// Whether no scope is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Totals since the hub started.
    pub fn stats(&self) -> HeartbeatStats {
        *lock(&self.hub.totals)
    }

    /// The report of the latest completed tick, if any.
    pub fn last_tick(&self) -> Option<TickReport> {
        lock(&self.hub.last).clone()
    }

    pub(crate) fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }
}

impl fmt::Debug for Heartbeats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Heartbeats")
            .field("store", &self.hub.store)
            .field("tick", &self.hub.tick)
            .field("scopes", &self.len())
            .finish()
    }
}

impl Hub {
    /// Registers a scope; returns the id it unregisters with.
    pub(crate) fn register(&self, shared: Arc<Shared>) -> u64 {
        if !std::ptr::addr_eq(Arc::as_ptr(&self.store), Arc::as_ptr(&shared.store)) {
            tracing::warn!(
                hub = %self.store,
                scope = %shared.store,
                "a scope registered with a heartbeat hub over another store object; the hub renews through its own"
            );
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        lock(&self.members).insert(id, shared);
        id
    }

    pub(crate) fn unregister(&self, id: u64) {
        lock(&self.members).remove(&id);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The hub's task: one tick every `tick` until every handle is dropped.
async fn run(hub: Arc<Hub>, stop: CancellationToken) {
    let mut ticks = tokio::time::interval_at(Instant::now() + hub.tick, hub.tick);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            _ = ticks.tick() => {}
        }
        let report = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            report = tick(&hub) => report,
        };
        let mut totals = lock(&hub.totals);
        totals.ticks += 1;
        totals.round_trips += report.round_trips as u64;
        totals.renewed += report.renewed as u64;
        totals.rejected += report.rejected as u64;
        totals.failed += report.failed as u64;
        drop(totals);
        *lock(&hub.last) = Some(report);
    }
}

/// What one chunk's round trip came back with.
struct Chunk {
    members: Vec<Arc<Shared>>,
    sent: Instant,
    took: Duration,
    outcome: Result<Vec<lease_core::Result<Lease>>, Error>,
}

/// Renews every live member, chunks in parallel, each bounded by the tick, and routes the results.
async fn tick(hub: &Hub) -> TickReport {
    let started = Instant::now();
    let members: Vec<Arc<Shared>> = {
        let mut map = lock(&hub.members);
        map.retain(|_, s| !s.token.is_cancelled());
        map.values()
            // A scope whose end is in flight is not renewed: the end decides it.
            .filter(|s| !s.is_ending())
            .cloned()
            .collect()
    };
    let mut report = TickReport {
        leases: members.len(),
        ..TickReport::default()
    };
    let mut calls = JoinSet::new();
    let mut members = members.into_iter().peekable();
    while members.peek().is_some() {
        let chunk: Vec<Arc<Shared>> = members.by_ref().take(MAX_BATCH).collect();
        let store = hub.store.clone();
        let limit = hub.tick;
        report.round_trips += 1;
        calls.spawn(async move {
            let leases: Vec<Lease> = chunk.iter().map(|s| s.lease()).collect();
            let sent = Instant::now();
            let outcome = match tokio::time::timeout(limit, store.renew_many(&leases)).await {
                Ok(outcome) => outcome,
                Err(_) => Err(Error::unavailable(
                    "heartbeat",
                    format!("batch renewal did not answer within {limit:?}"),
                )),
            };
            Chunk {
                members: chunk,
                sent,
                took: sent.elapsed(),
                outcome,
            }
        });
    }
    // Each chunk's verdicts reach its scopes as soon as that chunk answers: one slow chunk
    // holds back no other chunk's renewals.
    while let Some(joined) = calls.join_next().await {
        match joined {
            Ok(chunk) => {
                report.latencies.push(chunk.took);
                route(chunk, &mut report);
            }
            // A panicking store: its scopes get no renewal and expire by their deadlines.
            Err(e) => tracing::error!(error = %e, "heartbeat batch task failed"),
        }
    }
    report.elapsed = started.elapsed();
    report
}

/// Hands each lease's result to its scope.
fn route(chunk: Chunk, report: &mut TickReport) {
    let Chunk {
        members,
        sent,
        outcome,
        ..
    } = chunk;
    let results = match outcome {
        Ok(results) if results.len() == members.len() => results,
        Ok(results) => {
            let why: Arc<str> = format!(
                "batch renewal returned {} results for {} leases",
                results.len(),
                members.len()
            )
            .into();
            tracing::error!(%why, "heartbeat batch answer malformed; not extending any deadline");
            for shared in &members {
                shared.failed(why.clone());
            }
            report.failed += members.len();
            return;
        }
        Err(e) if e.ends_lease() => {
            tracing::error!(error = %e, leases = members.len(), "heartbeat batch refused by a misconfigured store; cancelling its scopes");
            let e = Arc::new(e);
            for shared in &members {
                shared.cancel(CancelReason::Rejected(Arc::new(e.duplicate())));
            }
            report.rejected += members.len();
            return;
        }
        Err(e) => {
            let why: Arc<str> = e.to_string().into();
            tracing::warn!(error = %why, leases = members.len(), "heartbeat batch failed; deadlines not extended");
            for shared in &members {
                shared.failed(why.clone());
            }
            report.failed += members.len();
            return;
        }
    };
    for (shared, result) in members.iter().zip(results) {
        match result {
            Ok(lease) => {
                shared.renewed("hub", sent, lease);
                report.renewed += 1;
            }
            // While an end of the lease is in flight its own verdict decides the scope: a renewal
            // the store saw after a suspend is refused, and that is not a lost lease.
            Err(e) if e.ends_lease() && !shared.is_ending() => {
                shared.cancel(CancelReason::Rejected(Arc::new(e)));
                report.rejected += 1;
            }
            Err(e) if e.ends_lease() => {}
            Err(e) => {
                shared.failed(e.to_string().into());
                report.failed += 1;
            }
        }
    }
}
