//! `Worker`: the claim → handle → end loop every user of the store needs, on top of
//! [`RunScope`] and one [`Heartbeats`] hub, with the ends of leases group-committed.
//!
//! Split by role: [`config`] (how it runs), [`context`] (what a handler sees, what the worker
//! reports), [`batcher`] (the group-committed ends), [`job`] (one claimed run: its handler and
//! its end), and here the claim loop.

mod batcher;
mod config;
mod context;
mod drain;
mod job;
mod kinds;
mod policy;
mod purging;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lease_core::{End, Ending, InvalidInput, Kind, LeaseStore, Result, WorkerId, MAX_BATCH};
use tokio::sync::{mpsc, Notify, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::heartbeats::Heartbeats;
use crate::retention::PURGER_KIND;
use crate::scope::{RunScope, ScopeConfig};

use batcher::{batcher, submit, Batcher, Shared};
pub use config::{RetryPolicy, WorkerConfig, DEFAULT_WAKE_POLL};
use context::{bump, Counters, Observer};
pub use context::{EndReport, Handler, HandlerFuture, RunContext, WorkerReport};
use job::{job, Job};
pub use kinds::Kinds;
use kinds::{Lane, Slot};
pub use policy::KindPolicy;
use purging::stop_purger;

/// Runs a handler for every run it can claim, up to a concurrency limit, and ends each lease
/// as its handler says, in group-committed batches.
///
/// - It claims with [`claim_next`](LeaseStore::claim_next) sized to its free slots, and backs
///   off (1 ms doubling up to the poll interval) while there is nothing to claim.
/// - Every held lease is driven by a [`RunScope`] renewed through one [`Heartbeats`] hub; a
///   handler whose scope is already cancelled is never started.
/// - A handler returns an [`End`]: complete, complete with an effect (the effect's journal
///   entry and the completion are one write), release, release with a retry delay, suspend,
///   fail, or one it committed itself. An error or a panic is a failed attempt: the run is
///   given back with the [`RetryPolicy`]'s delay (on the store's clock, the attempt counted:
///   [`End::AttemptFailed`]), or failed, with the error as its reason, at the policy's last
///   attempt ([`Lease::attempt`](lease_core::Lease::attempt): claims since the run was created or
///   resumed, less voluntary ends). A run **claimed** past the budget (its holders crashed or
///   vanished) is failed without running its handler. With
///   [`with_attempt_timeout`](WorkerConfig::with_attempt_timeout) a handler past its deadline
///   is cancelled, then stopped after the grace (aborted, and no longer waited for): a failed
///   attempt. Whatever a handler returns
///   after a cancellation that was not the shutdown's (its attempt deadline, its lease's local
///   deadline) counts as a failed attempt too; only the shutdown and an explicit
///   [`End::Release`] hand the run back at once. The ends of many handlers go to the store in one
///   [`end_many`](LeaseStore::end_many) (one round trip, one commit); a batch closes at its
///   size or after its delay. **No end is reported before the batch that carries it
///   committed** ([`Worker::on_end`], [`WorkerReport`]).
/// - A batch that fails without an answer is retried while its oldest lease is younger than
///   the TTL; an item that answers [`Error::LeaseEnded`](lease_core::Error::LeaseEnded) with its own fence and end on a
///   retry was committed by the first attempt and counts as done.
/// - On `shutdown` it stops claiming, lets running handlers finish for up to the grace period,
///   then cancels and stops the rest and **releases** their runs, so another worker claims them
///   at once instead of after the TTL; it returns when every lease it held is ended or given
///   up: within the grace and one more store call, whatever the handlers do.
///
/// A handler that ignores its token and writes after its lease was lost is refused by the
/// store's fence, not merely late.
///
/// # Handlers that block their thread
///
/// Handlers run as Tokio tasks, and a task is only stopped when it yields. One that blocks its
/// thread (`std::thread::sleep`, a blocking client, a CPU loop) cannot be stopped: once its
/// attempt deadline and the grace have passed (or the shutdown's grace), the worker aborts it
/// and **stops waiting for it**. The lease is ended as for any stopped handler (a failed
/// attempt, counted in the budget; released at the shutdown), the renewals stop, the slot serves
/// the next run, and `run` returns at shutdown. The blocked thread is **leaked** to the handler
/// until it returns; what it writes then is refused by the fence
/// ([`Error::LeaseEnded`](lease_core::Error::LeaseEnded), or
/// [`Error::StaleFence`](lease_core::Error::StaleFence) once the run was claimed again), and the
/// future is dropped at its first yield.
///
/// - On a **multi-thread** runtime the first blocked handler takes one worker thread out of
///   the runtime; the worker's own tasks (deadlines, renewals, ends, claims) run on the others.
///   From then on (a warning says so once) this worker runs each handler on a thread of its
///   own from the runtime's blocking pool (`spawn_blocking`, the handler's future driven by
///   `Handle::block_on`), so a handler blocked again, by a retry of its run or another run,
///   leaves the runtime's threads to the worker. That costs a thread hand-off per job, which
///   is why it is not the default; with a single runtime worker thread the first block still
///   stalls the runtime until it ends.
/// - On a **`current_thread`** runtime a blocked handler blocks the whole runtime: no
///   deadline, renewal or shutdown runs until it yields, and the lease may expire meanwhile
///   (its later writes are still fenced). Attempt deadlines hold there only for handlers that
///   yield.
///
/// Blocking work belongs in [`spawn_blocking`](tokio::task::spawn_blocking), watching the
/// handler's token, which the deadline, a lost lease and the shutdown cancel. The handler
/// awaits the blocking task, so it is stopped on time; the blocking closure itself cannot be
/// aborted, so it checks the token between steps and stops writing once it is cancelled:
///
/// ```
/// # use lease_core::{BoxError, End};
/// # use lease_runtime::RunContext;
/// async fn handler(ctx: RunContext) -> Result<End, BoxError> {
///     let token = ctx.token();
///     let done = tokio::task::spawn_blocking(move || {
///         for _step in 0..100 {
///             if token.is_cancelled() {
///                 return false; // the attempt is over: stop, write nothing more
///             }
///             // ... one bounded piece of blocking work ...
///         }
///         true
///     })
///     .await?;
///     Ok(if done { End::Complete } else { End::Release })
/// }
/// # let _ = handler;
/// ```
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
/// use std::sync::Arc;
/// use lease_core::{End, LeaseStore, LeaseStoreExt, RunId, RunState, Ttl, WorkerId};
/// use lease_runtime::{CancellationToken, MemoryLeaseStore, RunContext, Worker, WorkerConfig};
///
/// let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
/// let ids: Vec<RunId> = (0..20).map(|i| RunId::new(format!("job-{i}"))).collect::<Result<_, _>>()?;
/// store.create_many(&ids).await?;
///
/// let config = WorkerConfig::new(Ttl::from_secs(30)?).with_concurrency(4);
/// let worker = Worker::new(store.clone(), WorkerId::new("worker-a")?, config)?;
/// let shutdown = CancellationToken::new();
/// let stop = shutdown.clone();
/// let report = worker
///     .run(
///         move |ctx: RunContext| {
///             let stop = stop.clone();
///             async move {
///                 if ctx.run().as_str() == "job-19" {
///                     stop.cancel(); // the last job asks the worker to shut down
///                 }
///                 // The job's effect and its completion commit together.
///                 Ok(End::CompleteWith(format!("done {}", ctx.run()).into_bytes()))
///             }
///         },
///         shutdown,
///     )
///     .await?;
/// assert_eq!(report.completed, 20);
/// let record = store.inspect(&RunId::new("job-7")?).await?;
/// assert_eq!(record.state, RunState::Completed);
/// assert_eq!(store.journal(&record.run).await?[0].payload, b"done job-7");
/// # Ok(()) }
/// ```
pub struct Worker {
    store: Arc<dyn LeaseStore>,
    id: WorkerId,
    config: WorkerConfig,
    observers: Vec<Observer>,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("store", &self.store)
            .field("id", &self.id)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// A worker claiming as `id` from `store`.
    ///
    /// # Errors
    /// [`InvalidInput::WorkerSetting`] or [`InvalidInput::ScopeTiming`] for a configuration out
    /// of range.
    pub fn new(
        store: Arc<dyn LeaseStore>,
        id: WorkerId,
        config: WorkerConfig,
    ) -> Result<Worker, InvalidInput> {
        config.check()?;
        Ok(Worker {
            store,
            id,
            config,
            observers: Vec::new(),
        })
    }

    /// Calls `observer` for every lease end once the store decided it (after its batch
    /// committed, or after the last attempt failed). Keep it quick: it runs on the batcher.
    pub fn on_end(mut self, observer: impl Fn(&EndReport<'_>) + Send + Sync + 'static) -> Worker {
        self.observers.push(Arc::new(observer));
        self
    }

    /// The worker's id.
    pub fn id(&self) -> &WorkerId {
        &self.id
    }

    /// Runs until `shutdown` is cancelled and every held lease is ended, or until the store
    /// reports a configuration it cannot be used with.
    ///
    /// # Errors
    /// [`Error::Misconfigured`](lease_core::Error::Misconfigured) (or another non-retryable error) from `claim_next`, after the
    /// same graceful shutdown.
    pub async fn run(
        &self,
        handler: impl Handler,
        shutdown: CancellationToken,
    ) -> Result<WorkerReport> {
        self.run_kinds(Kinds::new().handle(Kind::default(), handler), shutdown)
            .await
    }

    /// [`run`](Worker::run) for several kinds, each with its handler ([`Kinds`]): the worker
    /// claims only the kinds it serves, each through its own index
    /// ([`claim_next_kind`](LeaseStore::claim_next_kind)), taking them in turn so that no
    /// kind starves another, within the worker's concurrency and each kind's own limit.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
    /// use std::sync::Arc;
    /// use lease_core::{End, Kind, LeaseStore, NewRun, RunId, RunState, Ttl, WorkerId};
    /// use lease_runtime::{CancellationToken, Kinds, MemoryLeaseStore, RunContext, Worker, WorkerConfig};
    ///
    /// let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
    /// let (email, charge, report) = (Kind::new("email")?, Kind::new("charge")?, Kind::new("report")?);
    /// for (id, kind) in [("e1", &email), ("c1", &charge), ("r1", &report)] {
    ///     store.create_with(&NewRun::new(RunId::new(id)?).with_kind(kind.clone())).await?;
    /// }
    /// let shutdown = CancellationToken::new();
    /// let stop = shutdown.clone();
    /// let kinds = Kinds::new()
    ///     .handle(email, |_ctx: RunContext| async { Ok(End::Complete) })
    ///     .handle_limited(charge, move |_ctx: RunContext| {
    ///         let stop = stop.clone();
    ///         async move {
    ///             stop.cancel();
    ///             Ok(End::CompleteWith(b"charged".to_vec()))
    ///         }
    ///     }, 1);
    /// let worker = Worker::new(store.clone(), WorkerId::new("w1")?, WorkerConfig::new(Ttl::from_secs(30)?))?;
    /// worker.run_kinds(kinds, shutdown).await?;
    /// // No worker serves `report`: its run waits.
    /// assert_eq!(store.inspect(&RunId::new("r1")?).await?.state, RunState::Runnable);
    /// assert_eq!(store.inspect(&RunId::new("c1")?).await?.state, RunState::Completed);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`InvalidInput::WorkerSetting`] for no kind, a kind twice, or a kind's limit out of
    /// range, before anything is claimed; then as [`run`](Worker::run).
    pub async fn run_kinds(
        &self,
        kinds: Kinds,
        shutdown: CancellationToken,
    ) -> Result<WorkerReport> {
        kinds.check(self.config.concurrency)?;
        if self.config.retention.is_some() {
            if let Some(route) = kinds.routes.iter().find(|r| r.kind.as_str() == PURGER_KIND) {
                return Err(InvalidInput::WorkerSetting {
                    setting: "kinds",
                    value: route.kind.to_string(),
                    rule: "with retention, a worker does not serve PURGER_KIND: its run is the purge lease",
                }
                .into());
            }
        }
        let span = tracing::info_span!("worker", worker = %self.id, store = %self.store);
        self.run_in_span(
            Lane::from_routes(kinds.routes, &self.config.queues()),
            shutdown,
        )
        .instrument(span)
        .await
    }

    async fn run_in_span(
        &self,
        lanes: Vec<Lane>,
        shutdown: CancellationToken,
    ) -> Result<WorkerReport> {
        let counters = Arc::new(Counters::default());
        let purging = self.start_purger(&shutdown);
        let hub = Heartbeats::new(self.store.clone(), self.config.heartbeat())?;
        let mut scope_config = ScopeConfig::default().with_heartbeats(hub.clone());
        if let Some(margin) = self.config.margin {
            scope_config = scope_config.with_margin(margin);
        }
        // Cancelled when the grace period ends: every scope's parent.
        let abandon = CancellationToken::new();
        let own_threads = Arc::new(std::sync::atomic::AtomicBool::new(false));
        scope_config = scope_config.with_parent(abandon.clone());

        let (ends_tx, ends_rx) = mpsc::unbounded_channel();
        let batcher = tokio::spawn(batcher(Batcher {
            shared: Arc::new(Shared {
                store: self.store.clone(),
                stop: abandon.clone(),
                counters: counters.clone(),
                observers: self.observers.clone(),
            }),
            rx: ends_rx,
            size: self.config.batch_size,
            delay: self.config.batch_delay,
        }));

        let slots = Arc::new(Semaphore::new(self.config.concurrency));
        // A kind's or queue's slot came free: wakes the loop when every lane was at its limits.
        let freed = Arc::new(Notify::new());
        // The lane (a kind in a queue) whose turn is next, and how many claims in a row found
        // nothing.
        let mut turn = 0;
        let mut empty = 0;
        // Which lanes were claimed from and found empty since the last claim that took runs.
        let mut found_empty = vec![false; lanes.len()];
        let mut jobs = JoinSet::new();
        let mut idle = Duration::ZERO;
        // The store's wake-ups, subscribed before the first claim so that none is missed.
        let served: Vec<Kind> = lanes.iter().map(|lane| lane.kind.clone()).collect();
        let mut wakes = match self.config.wake_poll {
            Some(every) => self.store.wakes().map(|w| (w.subscribe(), every)),
            None => None,
        };
        let mut fatal = None;
        // A claim in flight when the shutdown came: it runs to its end (a claim dropped
        // mid-flight would leave runs held until their TTL) while the shutdown goes on.
        let mut in_flight = None;
        tracing::info!(concurrency = self.config.concurrency, ttl = ?self.config.ttl.as_duration(), "worker started");
        while !shutdown.is_cancelled() {
            // Reap finished jobs so the set does not grow.
            while jobs.try_join_next().is_some() {}
            let first = tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                permit = slots.clone().acquire_owned() => permit.expect("semaphore never closed"),
            };
            // The next lane in turn with room under its kind's and queue's limits.
            let Some((lane, first_slots)) = (0..lanes.len()).find_map(|i| {
                let at = (turn + i) % lanes.len();
                lanes[at].try_slot().map(|slot| (at, slot))
            }) else {
                // Every lane is at a limit of its own: wait for one of their jobs to end.
                drop(first);
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    () = freed.notified() => continue,
                }
            };
            let lane_at = lane;
            turn = lane + 1;
            let lane = &lanes[lane];
            let mut permits = vec![Slot {
                _worker: first,
                lane: first_slots,
                freed: freed.clone(),
            }];
            // Handlers that end at once free their slots a few at a time, as the runtime gets
            // to them: a claim sent at the first free slot would be a fraction of the room
            // (35-45 of 64 in a drain), and each claim has a fixed cost. While under half the
            // slots are free, let the handlers already woken finish first (six times at most; a
            // yield is free when nothing else is ready).
            for _ in 0..6 {
                if slots.available_permits() + 1 >= self.config.concurrency / 2 {
                    break;
                }
                tokio::task::yield_now().await;
            }
            while permits.len() < MAX_BATCH {
                let Ok(worker) = slots.clone().try_acquire_owned() else {
                    break;
                };
                let Some(lane_slots) = lane.try_slot() else {
                    break;
                };
                permits.push(Slot {
                    _worker: worker,
                    lane: lane_slots,
                    freed: freed.clone(),
                });
            }
            if !found_empty.contains(&true) {
                // A new round of claims: what woke the worker so far is answered by it; what
                // comes from now on (even during the claims) wakes the next wait.
                if let Some((rx, _)) = &mut wakes {
                    rx.clear();
                }
            }
            let sent = Instant::now();
            let claim = {
                let (store, id, ttl, max, kind, queue) = (
                    self.store.clone(),
                    self.id.clone(),
                    self.config.ttl,
                    permits.len(),
                    lane.kind.clone(),
                    lane.queue.clone(),
                );
                tokio::spawn(async move { store.claim_next_in(&queue, &kind, &id, ttl, max).await })
            };
            let mut claim = claim;
            let claimed = tokio::select! {
                biased;
                joined = &mut claim => joined.unwrap_or_else(|e| {
                    Err(lease_core::Error::backend("worker", format!("claim_next task failed: {e}")))
                }),
                _ = shutdown.cancelled() => {
                    in_flight = Some(claim);
                    break;
                }
            };
            let leases = match claimed {
                Ok(leases) => leases,
                Err(e) if e.is_retryable() => {
                    tracing::warn!(error = %e, "claim_next failed; backing off");
                    idle = backoff(idle, self.config.poll_interval);
                    drop(permits);
                    pause(idle, &shutdown).await;
                    continue;
                }
                Err(e) => {
                    tracing::error!(error = %e, "claim_next refused; the worker stops");
                    fatal = Some(e);
                    break;
                }
            };
            if leases.is_empty() {
                bump(&counters.empty_polls);
                drop(permits);
                // Back off once every lane in turn found nothing.
                empty += 1;
                found_empty[lane_at] = true;
                if empty >= lanes.len() {
                    empty = 0;
                    // Only a worker whose every lane was claimed from and found empty sleeps
                    // until woken: a lane skipped at a limit may have runs waiting, and is
                    // tried again after the backoff.
                    let all_empty = !found_empty.contains(&false);
                    found_empty.fill(false);
                    let idle_wait = match &mut wakes {
                        Some(wakes) if all_empty && wakes.0.is_live() => Some(wakes),
                        _ => None,
                    };
                    match idle_wait {
                        Some((rx, every)) => {
                            tokio::select! {
                                _ = shutdown.cancelled() => {}
                                () = rx.woken(&served) => bump(&counters.wake_ups),
                                () = tokio::time::sleep(*every) => {}
                            }
                        }
                        None => {
                            idle = backoff(idle, self.config.poll_interval);
                            pause(idle, &shutdown).await;
                        }
                    }
                }
                continue;
            }
            empty = 0;
            found_empty.fill(false);
            idle = Duration::ZERO;
            for (lease, permit) in leases.into_iter().zip(permits.drain(..)) {
                bump(&counters.claimed);
                if let Some(waited) = lease.waited() {
                    metrics::histogram!(crate::observe::WORKER_WAIT, "kind" => lease.kind().to_string(), "queue" => lease.queue().to_string())
                        .record(waited.as_secs_f64());
                }
                let scope = match RunScope::from_lease(
                    self.store.clone(),
                    lease.clone(),
                    sent,
                    scope_config.clone(),
                ) {
                    Ok(scope) => Arc::new(scope),
                    Err(e) => {
                        // Checked in Worker::new; a store returning a lease of another TTL.
                        tracing::error!(run = %lease.run(), error = %e, "cannot drive lease");
                        let end = Ending::new(lease, End::Release);
                        let give_up_at = sent + self.config.ttl.as_duration();
                        let _ = submit(&ends_tx, end, None, false, give_up_at).await;
                        continue;
                    }
                };
                // OpenTelemetry's messaging attributes for a consumer's `process` span, which
                // tracing-opentelemetry exports as such; the trace it continues is the one the
                // run was enqueued in (`trace.rs`).
                let span = tracing::info_span!(
                    "job",
                    run = %lease.run(),
                    kind = %lease.kind(),
                    fence = lease.fence().get(),
                    attempt = lease.attempt(),
                    trace_parent = tracing::field::Empty,
                    otel.kind = "consumer",
                    messaging.system = "lease",
                    messaging.operation.type = "process",
                    messaging.destination.name = %lease.queue(),
                );
                crate::trace::continue_trace(&span, lease.trace_parent());
                jobs.spawn(
                    job(Job {
                        scope,
                        handler: lane.handler.clone(),
                        ends: ends_tx.clone(),
                        counters: counters.clone(),
                        shutdown: shutdown.clone(),
                        abandon: abandon.clone(),
                        retry: lane.policy.retry.unwrap_or(self.config.retry),
                        attempt_timeout: lane
                            .policy
                            .attempt_timeout
                            .or(self.config.attempt_timeout),
                        grace: self.config.grace,
                        own_threads: own_threads.clone(),
                        _slot: permit,
                    })
                    .instrument(span),
                );
            }
        }

        // Shutdown: no more claims. Let handlers finish for the grace period, then cancel the
        // rest; their jobs release the runs.
        tracing::info!(running = jobs.len(), grace = ?self.config.grace, "worker stopping");
        let grace_end = Instant::now() + self.config.grace;
        loop {
            tokio::select! {
                joined = jobs.join_next() => if joined.is_none() { break },
                _ = tokio::time::sleep_until(grace_end), if !abandon.is_cancelled() => {
                    tracing::warn!(running = jobs.len(), "grace period over; cancelling handlers and releasing their runs");
                    abandon.cancel();
                }
            }
        }
        // The claim that was in flight, if any: its runs are given back, even past the grace
        // (a run it claimed but left to its TTL would wait out the TTL and would have spent
        // an attempt on a deploy). The store's own call timeout bounds it; so does the TTL,
        // past which what it claimed has expired anyway (its fence is never reused).
        if let Some(mut claim) = in_flight {
            let give_up = grace_end.max(Instant::now() + self.config.ttl.as_duration());
            tokio::select! {
                joined = &mut claim => {
                    if let Ok(Ok(leases)) = joined {
                        for lease in leases {
                            bump(&counters.claimed);
                            bump(&counters.not_started);
                            let ends = ends_tx.clone();
                            let give_up_at = Instant::now() + self.config.ttl.as_duration();
                            tokio::spawn(async move {
                                let _ = submit(&ends, Ending::new(lease, End::Release), None, false, give_up_at).await;
                            });
                        }
                    }
                }
                () = tokio::time::sleep_until(give_up) => {
                    tracing::warn!("the claim in flight at the shutdown never answered; abandoning it to its TTL");
                    claim.abort();
                }
            }
        }
        drop(ends_tx);
        // The last ends are retried until the grace ends; then each gets one last attempt,
        // so the shutdown takes at most one more store call past the grace.
        let mut batcher = batcher;
        let finished = tokio::select! {
            joined = &mut batcher => Some(joined),
            () = tokio::time::sleep_until(grace_end) => None,
        };
        let finished = match finished {
            Some(joined) => joined,
            None => {
                abandon.cancel();
                batcher.await
            }
        };
        if let Err(e) = finished {
            tracing::error!(error = %e, "the batcher task failed");
        }
        drop(hub);
        let mut report = counters.report();
        if let Some(purging) = purging {
            report.purged = stop_purger(purging).await;
        }
        tracing::info!(?report, "worker stopped");
        match fatal {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }
}

/// The next idle pause: 1 ms, doubling, at most `max`.
fn backoff(current: Duration, max: Duration) -> Duration {
    (current * 2).clamp(Duration::from_millis(1), max)
}

async fn pause(by: Duration, shutdown: &CancellationToken) {
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = tokio::time::sleep(by) => {}
    }
}
