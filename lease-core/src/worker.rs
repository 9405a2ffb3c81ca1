//! `Worker`: the claim → handle → end loop every user of the store needs, on top of
//! [`RunScope`] and one [`Heartbeats`] hub, with the ends of leases group-committed.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::error::{BoxError, Error, InvalidInput, Result};
use crate::heartbeats::Heartbeats;
use crate::id::{RunId, WorkerId};
use crate::scope::{CancelReason, RunScope, ScopeConfig};
use crate::store::LeaseStore;
use crate::types::{End, Ending, Fence, JournalEntry, Lease, Ttl, MAX_BATCH};

/// How a [`Worker`] runs: lease TTL, how many handlers at once, how it polls when idle, how it
/// batches the ends of leases, and how long a shutdown waits for handlers.
///
/// ```
/// # fn main() -> Result<(), lease_core::InvalidInput> {
/// use std::time::Duration;
/// use lease_core::{Ttl, WorkerConfig};
///
/// let config = WorkerConfig::new(Ttl::from_secs(30)?)
///     .with_concurrency(64)
///     .with_batch(256, Duration::from_millis(2))
///     .with_grace(Duration::from_secs(5));
/// assert_eq!(config.concurrency(), 64);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    ttl: Ttl,
    concurrency: usize,
    poll_interval: Duration,
    batch_size: usize,
    batch_delay: Duration,
    grace: Duration,
    heartbeat: Option<Duration>,
    margin: Option<Duration>,
}

impl WorkerConfig {
    /// Leases of `ttl`; defaults: 10 handlers at once, idle polls backing off up to every
    /// 100 ms, ends flushed at 100 or 1 ms after the first one waits, 10 s of grace at
    /// shutdown, the hub renewing every TTL/3 with a margin of TTL/10.
    pub fn new(ttl: Ttl) -> WorkerConfig {
        WorkerConfig {
            ttl,
            concurrency: 10,
            poll_interval: Duration::from_millis(100),
            batch_size: 100,
            batch_delay: Duration::from_millis(1),
            grace: Duration::from_secs(10),
            heartbeat: None,
            margin: None,
        }
    }

    /// At most `n` handlers run at once (1 to 10,000); `claim_next` asks for the free slots.
    pub fn with_concurrency(mut self, n: usize) -> WorkerConfig {
        self.concurrency = n;
        self
    }

    /// When `claim_next` finds nothing, poll again after 1 ms, doubling up to `interval`. A
    /// run released by another worker is therefore claimed within one `interval`.
    pub fn with_poll_interval(mut self, interval: Duration) -> WorkerConfig {
        self.poll_interval = interval;
        self
    }

    /// Flush the ends of leases to the store in one [`end_many`](LeaseStore::end_many) when
    /// `size` (1 to [`MAX_BATCH`]) are waiting, or `delay` after the first one started waiting,
    /// whichever comes first. A zero delay flushes whatever is waiting at once.
    pub fn with_batch(mut self, size: usize, delay: Duration) -> WorkerConfig {
        self.batch_size = size;
        self.batch_delay = delay;
        self
    }

    /// At shutdown, wait up to `grace` for running handlers before cancelling them and
    /// releasing their leases.
    pub fn with_grace(mut self, grace: Duration) -> WorkerConfig {
        self.grace = grace;
        self
    }

    /// The hub renews every lease every `interval` instead of TTL/3.
    pub fn with_heartbeat(mut self, interval: Duration) -> WorkerConfig {
        self.heartbeat = Some(interval);
        self
    }

    /// Each scope's safety margin (see [`ScopeConfig::with_margin`]) instead of TTL/10.
    pub fn with_margin(mut self, margin: Duration) -> WorkerConfig {
        self.margin = Some(margin);
        self
    }

    /// The lease TTL.
    pub fn ttl(&self) -> Ttl {
        self.ttl
    }

    /// How many handlers run at once.
    pub fn concurrency(&self) -> usize {
        self.concurrency
    }

    fn heartbeat(&self) -> Duration {
        self.heartbeat.unwrap_or(self.ttl.as_duration() / 3)
    }

    fn check(&self) -> Result<(), InvalidInput> {
        let bad = |setting, value: String, rule| {
            Err(InvalidInput::WorkerSetting {
                setting,
                value,
                rule,
            })
        };
        if !(1..=10_000).contains(&self.concurrency) {
            return bad(
                "concurrency",
                self.concurrency.to_string(),
                "it must be 1 to 10000",
            );
        }
        if !(1..=MAX_BATCH).contains(&self.batch_size) {
            return bad(
                "batch size",
                self.batch_size.to_string(),
                "it must be 1 to 1000 (MAX_BATCH)",
            );
        }
        if self.poll_interval.is_zero() || self.poll_interval > Duration::from_secs(3600) {
            return bad(
                "poll interval",
                format!("{:?}", self.poll_interval),
                "it must be above zero and at most an hour",
            );
        }
        if self.batch_delay >= self.ttl.as_duration() / 2 {
            return bad(
                "batch delay",
                format!("{:?}", self.batch_delay),
                "it must be shorter than half the TTL",
            );
        }
        // The scopes' timing rules: heartbeat inside TTL minus margin.
        let mut scope = ScopeConfig::default().with_heartbeat(self.heartbeat());
        if let Some(margin) = self.margin {
            scope = scope.with_margin(margin);
        }
        scope.check(self.ttl)
    }
}

/// What a handler is given for one claimed run: the run, its lease and fence, the cancellation
/// token it must observe, and fenced writes under the lease.
///
/// The context does not end the lease: the handler returns an [`End`] and the worker ends it
/// in its next batch.
#[derive(Clone)]
pub struct RunContext {
    scope: Arc<RunScope>,
}

impl RunContext {
    /// The run.
    pub fn run(&self) -> &RunId {
        self.scope.run()
    }

    /// The lease as of its latest renewal.
    pub fn lease(&self) -> Lease {
        self.scope.lease()
    }

    /// The fence every write under this lease presents.
    pub fn fence(&self) -> Fence {
        self.scope.fence()
    }

    /// Cancelled when the lease may be lost (a refused renewal, the local deadline) or when a
    /// shutdown's grace period ends. Stop work when it is.
    pub fn token(&self) -> CancellationToken {
        self.scope.token()
    }

    /// Whether the token is cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.scope.is_cancelled()
    }

    /// Completes when the token is cancelled. Cancel safe.
    pub async fn cancelled(&self) {
        self.scope.cancelled().await
    }

    /// Appends to the run's journal under the lease's fence; the store's verdict is returned.
    ///
    /// # Errors
    /// As [`LeaseStore::append`].
    pub async fn append(&self, payload: &[u8]) -> Result<JournalEntry> {
        self.scope.append(payload).await
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

/// The work a [`Worker`] runs for each claimed run. Implemented for every
/// `Fn(RunContext) -> impl Future<Output = Result<End, BoxError>>`.
///
/// An `Err` (or a panic) releases the run for a retry, with the reason logged.
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

/// The end of one lease as the store decided it, handed to [`Worker::on_end`] observers after
/// the batch that carried it returned.
#[derive(Debug)]
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

type Observer = Arc<dyn Fn(&EndReport<'_>) + Send + Sync>;

/// Totals of a [`Worker::run`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkerReport {
    /// Leases claimed.
    pub claimed: u64,
    /// Handlers started.
    pub started: u64,
    /// Runs completed (with or without an effect), counted after their batch committed.
    pub completed: u64,
    /// Runs released, by their handler's choice, its failure, or the shutdown.
    pub released: u64,
    /// Runs suspended.
    pub suspended: u64,
    /// Handlers that returned an error or panicked (their runs were released).
    pub handler_errors: u64,
    /// Handlers still running when the shutdown grace ended (cancelled, their runs released).
    pub abandoned: u64,
    /// Ends the store refused with a verdict (the lease was lost: someone else holds the run).
    pub refused: u64,
    /// Ends that could not be committed (the store stayed unavailable); those leases expire.
    pub failed: u64,
    /// Leases whose scope was cancelled before their handler could start (not run).
    pub not_started: u64,
    /// `claim_next` calls that found nothing.
    pub empty_polls: u64,
    /// `end_many` round trips.
    pub batches: u64,
}

#[derive(Default)]
struct Counters {
    claimed: AtomicU64,
    started: AtomicU64,
    completed: AtomicU64,
    released: AtomicU64,
    suspended: AtomicU64,
    handler_errors: AtomicU64,
    abandoned: AtomicU64,
    refused: AtomicU64,
    failed: AtomicU64,
    not_started: AtomicU64,
    empty_polls: AtomicU64,
    batches: AtomicU64,
}

impl Counters {
    fn report(&self) -> WorkerReport {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        WorkerReport {
            claimed: get(&self.claimed),
            started: get(&self.started),
            completed: get(&self.completed),
            released: get(&self.released),
            suspended: get(&self.suspended),
            handler_errors: get(&self.handler_errors),
            abandoned: get(&self.abandoned),
            refused: get(&self.refused),
            failed: get(&self.failed),
            not_started: get(&self.not_started),
            empty_polls: get(&self.empty_polls),
            batches: get(&self.batches),
        }
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Runs a handler for every run it can claim, up to a concurrency limit, and ends each lease
/// as its handler says, in group-committed batches.
///
/// - It claims with [`claim_next`](LeaseStore::claim_next) sized to its free slots, and backs
///   off (1 ms doubling up to the poll interval) while there is nothing to claim.
/// - Every held lease is driven by a [`RunScope`] renewed through one [`Heartbeats`] hub; a
///   handler whose scope is already cancelled is never started.
/// - A handler returns an [`End`]: complete, complete with an effect (the effect's journal
///   entry and the completion are one write), release, or suspend. An error or a panic
///   releases the run. The ends of many handlers go to the store in one
///   [`end_many`](LeaseStore::end_many) (one round trip, one commit); a batch closes at its
///   size or after its delay. **No end is reported before the batch that carries it
///   committed** ([`Worker::on_end`], [`WorkerReport`]).
/// - A batch that fails without an answer is retried while its oldest lease is younger than
///   the TTL; an item that answers [`Error::LeaseEnded`] with its own fence and end on a
///   retry was committed by the first attempt and counts as done.
/// - On `shutdown` it stops claiming, lets running handlers finish for up to the grace period,
///   then cancels the rest and **releases** their runs, so another worker claims them at once
///   instead of after the TTL; it returns when every lease it held is ended or given up.
///
/// A handler that ignores its token and writes after its lease was lost is refused by the
/// store's fence, not merely late.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
/// use std::sync::Arc;
/// use lease_core::{
///     CancellationToken, End, LeaseStore, LeaseStoreExt, MemoryLeaseStore, RunContext, RunId,
///     RunState, Ttl, Worker, WorkerConfig, WorkerId,
/// };
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
    /// [`Error::Misconfigured`] (or another non-retryable error) from `claim_next`, after the
    /// same graceful shutdown.
    pub async fn run(
        &self,
        handler: impl Handler,
        shutdown: CancellationToken,
    ) -> Result<WorkerReport> {
        let span = tracing::info_span!("worker", worker = %self.id, store = %self.store);
        self.run_in_span(Arc::new(handler), shutdown)
            .instrument(span)
            .await
    }

    async fn run_in_span(
        &self,
        handler: Arc<dyn Handler>,
        shutdown: CancellationToken,
    ) -> Result<WorkerReport> {
        let counters = Arc::new(Counters::default());
        let hub = Heartbeats::new(self.store.clone(), self.config.heartbeat())?;
        let mut scope_config = ScopeConfig::default().with_heartbeats(hub.clone());
        if let Some(margin) = self.config.margin {
            scope_config = scope_config.with_margin(margin);
        }
        // Cancelled when the grace period ends: every scope's parent.
        let abandon = CancellationToken::new();
        scope_config = scope_config.with_parent(abandon.clone());

        let (ends_tx, ends_rx) = mpsc::unbounded_channel();
        let batcher = tokio::spawn(batcher(Batcher {
            store: self.store.clone(),
            rx: ends_rx,
            size: self.config.batch_size,
            delay: self.config.batch_delay,
            give_up_after: self.config.ttl.as_duration(),
            counters: counters.clone(),
            observers: self.observers.clone(),
        }));

        let slots = Arc::new(Semaphore::new(self.config.concurrency));
        let mut jobs = JoinSet::new();
        let mut idle = Duration::ZERO;
        let mut fatal = None;
        tracing::info!(concurrency = self.config.concurrency, ttl = ?self.config.ttl.as_duration(), "worker started");
        while !shutdown.is_cancelled() {
            // Reap finished jobs so the set does not grow.
            while jobs.try_join_next().is_some() {}
            let first = tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                permit = slots.clone().acquire_owned() => permit.expect("semaphore never closed"),
            };
            let mut permits = vec![first];
            while permits.len() < MAX_BATCH {
                match slots.clone().try_acquire_owned() {
                    Ok(p) => permits.push(p),
                    Err(_) => break,
                }
            }
            let sent = Instant::now();
            // Not raced with the shutdown: a claim dropped mid-flight would leave runs held
            // until their TTL. Leases that arrive after the shutdown are released below.
            let leases = match self
                .store
                .claim_next(&self.id, self.config.ttl, permits.len())
                .await
            {
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
                idle = backoff(idle, self.config.poll_interval);
                drop(permits);
                pause(idle, &shutdown).await;
                continue;
            }
            idle = Duration::ZERO;
            for (lease, permit) in leases.into_iter().zip(permits.drain(..)) {
                bump(&counters.claimed);
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
                        let _ = submit(&ends_tx, end, false).await;
                        continue;
                    }
                };
                jobs.spawn(job(Job {
                    scope,
                    handler: handler.clone(),
                    ends: ends_tx.clone(),
                    counters: counters.clone(),
                    shutdown: shutdown.clone(),
                    abandon: abandon.clone(),
                    _slot: permit,
                }));
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
        drop(ends_tx);
        if let Err(e) = batcher.await {
            tracing::error!(error = %e, "the batcher task failed");
        }
        drop(hub);
        let report = counters.report();
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

struct Job {
    scope: Arc<RunScope>,
    handler: Arc<dyn Handler>,
    ends: mpsc::UnboundedSender<Pending>,
    counters: Arc<Counters>,
    shutdown: CancellationToken,
    /// Cancelled when the shutdown's grace period ends.
    abandon: CancellationToken,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

/// One claimed run: its handler (unless its scope is already cancelled, or the worker is
/// shutting down), then the end of its lease through the batcher.
async fn job(job: Job) {
    let Job {
        scope,
        handler,
        ends,
        counters,
        shutdown,
        abandon,
        _slot,
    } = job;
    let run = scope.run().clone();
    let fence = scope.fence();
    let (end, by_handler) = if scope.is_cancelled() || shutdown.is_cancelled() {
        // Never start work on a lease that may be lost, or after the shutdown began; give the
        // run back (a fenced write: refused harmlessly if the lease is gone).
        bump(&counters.not_started);
        (End::Release, false)
    } else {
        bump(&counters.started);
        let ctx = RunContext {
            scope: scope.clone(),
        };
        let mut task = tokio::spawn(handler.call(ctx));
        // A handler whose lease is lost is cancelled through its token and may finish (its
        // writes are fenced); one still running when the shutdown's grace ends is stopped.
        let outcome = tokio::select! {
            joined = &mut task => joined,
            _ = abandon.cancelled() => {
                task.abort();
                task.await
            }
        };
        match outcome {
            Ok(Ok(end)) => (end, true),
            Ok(Err(e)) => {
                bump(&counters.handler_errors);
                tracing::warn!(%run, %fence, error = %e, "handler failed; releasing the run");
                (End::Release, false)
            }
            Err(e) if e.is_panic() => {
                bump(&counters.handler_errors);
                tracing::error!(%run, %fence, "handler panicked; releasing the run");
                (End::Release, false)
            }
            Err(_) => {
                bump(&counters.abandoned);
                tracing::warn!(%run, %fence, "handler outlived the shutdown grace; releasing the run");
                (End::Release, false)
            }
        }
    };
    drop(_slot);
    if let Some(CancelReason::Rejected(e)) = scope.cancel_reason().map(|(_, r)| r) {
        // The store already said the lease is gone; an end would only be refused again.
        tracing::debug!(%run, %fence, error = %e, "lease lost before its end; not ending it");
        bump(&counters.refused);
        return;
    }
    let how = match end.state() {
        crate::RunState::Completed => CancelReason::Completed,
        crate::RunState::Suspended => CancelReason::Suspended,
        crate::RunState::Runnable => CancelReason::Released,
    };
    let _ = scope
        .end_with(how, |lease| {
            submit(&ends, Ending::new(lease, end), by_handler)
        })
        .await;
}

/// An end waiting for its batch.
struct Pending {
    ending: Ending,
    by_handler: bool,
    queued: Instant,
    /// Attempts that failed without an answer: a later `LeaseEnded` with the same fence and
    /// end means one of them committed.
    unanswered: u32,
    reply: oneshot::Sender<Result<()>>,
}

/// Queues `ending` and waits for its verdict.
async fn submit(
    ends: &mpsc::UnboundedSender<Pending>,
    ending: Ending,
    by_handler: bool,
) -> Result<()> {
    let (reply, answer) = oneshot::channel();
    let pending = Pending {
        ending,
        by_handler,
        queued: Instant::now(),
        unanswered: 0,
        reply,
    };
    if ends.send(pending).is_err() {
        return Err(Error::backend("worker", "the batcher stopped"));
    }
    answer
        .await
        .unwrap_or_else(|_| Err(Error::backend("worker", "the batcher dropped an end")))
}

struct Batcher {
    store: Arc<dyn LeaseStore>,
    rx: mpsc::UnboundedReceiver<Pending>,
    size: usize,
    delay: Duration,
    give_up_after: Duration,
    counters: Arc<Counters>,
    observers: Vec<Observer>,
}

/// Collects ends into batches (closed at `size`, or `delay` after the oldest waiting end was
/// queued) and commits each with one `end_many`; one batch in flight at a time, so the ends
/// that arrive during a commit form the next batch.
async fn batcher(mut b: Batcher) {
    let mut queue: VecDeque<Pending> = VecDeque::new();
    let mut open = true;
    let mut retry_pause = Duration::ZERO;
    loop {
        if queue.is_empty() {
            if !open {
                break;
            }
            match b.rx.recv().await {
                Some(p) => queue.push_back(p),
                None => break,
            }
        }
        let close_at = queue
            .front()
            .map(|p| p.queued + b.delay)
            .unwrap_or_else(Instant::now);
        while open && queue.len() < b.size {
            match b.rx.try_recv() {
                Ok(p) => {
                    queue.push_back(p);
                    continue;
                }
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
                Err(mpsc::error::TryRecvError::Empty) => {}
            }
            match tokio::time::timeout_at(close_at, b.rx.recv()).await {
                Ok(Some(p)) => queue.push_back(p),
                Ok(None) => open = false,
                Err(_) => break,
            }
        }
        if !retry_pause.is_zero() {
            tokio::time::sleep(retry_pause).await;
        }
        let take = queue.len().min(b.size);
        let batch: Vec<Pending> = queue.drain(..take).collect();
        let retry = flush(&b, batch).await;
        retry_pause = if retry.is_empty() {
            Duration::ZERO
        } else {
            (retry_pause * 2).clamp(Duration::from_millis(5), Duration::from_secs(1))
        };
        // Retried ends go first: they are the oldest.
        for p in retry.into_iter().rev() {
            queue.push_front(p);
        }
    }
}

/// Commits one batch; returns the ends to retry (failed without an answer, still young enough).
async fn flush(b: &Batcher, mut batch: Vec<Pending>) -> Vec<Pending> {
    // The ends (and their effects' payloads) move into the call and back: a payload is never
    // copied on this path.
    let ends: Vec<Ending> = batch
        .iter_mut()
        .map(|p| {
            let end = std::mem::replace(&mut p.ending.end, End::Complete);
            Ending::new(p.ending.lease.clone(), end)
        })
        .collect();
    bump(&b.counters.batches);
    metrics::histogram!(crate::observe::WORKER_BATCH_SIZE).record(batch.len() as f64);
    // Bounded: a call stuck on a dead connection is abandoned (its ends are retried, and a
    // retry recognises an abandoned call that did commit), so a shutdown always finishes.
    let call = tokio::time::timeout(b.give_up_after, b.store.end_many(&ends));
    let answer = call.await.unwrap_or_else(|_| {
        Err(Error::unavailable(
            "worker",
            format!("end_many did not answer within {:?}", b.give_up_after),
        ))
    });
    for (p, sent) in batch.iter_mut().zip(ends) {
        p.ending.end = sent.end;
    }
    let results = match answer {
        Ok(results) if results.len() == batch.len() => results,
        Ok(results) => {
            let why = format!(
                "end_many returned {} results for {} ends",
                results.len(),
                batch.len()
            );
            tracing::error!(%why, "malformed batch answer; treating the batch as unanswered");
            let e = Error::unavailable("worker", why);
            batch.iter().map(|_| Err(e.duplicate())).collect()
        }
        Err(e) => {
            tracing::warn!(error = %e, ends = batch.len(), "batch of ends failed");
            batch.iter().map(|_| Err(e.duplicate())).collect()
        }
    };
    let mut retry = Vec::new();
    for (mut p, result) in batch.into_iter().zip(results) {
        let result = match result {
            // A retry of an end whose earlier attempt went unanswered: the same fence and the
            // same end mean that attempt committed (only this lease can end the run under it).
            Err(Error::LeaseEnded { fence, ended, .. })
                if p.unanswered > 0
                    && fence == p.ending.lease.fence().get()
                    && ended == p.ending.end.ended() =>
            {
                Ok(())
            }
            Err(e) if e.is_retryable() && p.queued.elapsed() < b.give_up_after => {
                p.unanswered += 1;
                retry.push(p);
                continue;
            }
            other => other,
        };
        decided(b, p, result);
    }
    retry
}

/// Counts, reports and answers one end the store decided.
fn decided(b: &Batcher, p: Pending, result: Result<()>) {
    let c = &b.counters;
    let outcome = match &result {
        Ok(()) => "committed",
        Err(e) if e.is_verdict() => "refused",
        Err(_) => "failed",
    };
    metrics::counter!(crate::observe::WORKER_ENDS, "end" => p.ending.end.as_str(), "outcome" => outcome)
        .increment(1);
    match &result {
        Ok(()) => match p.ending.end.state() {
            crate::RunState::Completed => bump(&c.completed),
            crate::RunState::Suspended => bump(&c.suspended),
            crate::RunState::Runnable => bump(&c.released),
        },
        Err(e) if e.is_verdict() => {
            tracing::warn!(run = %p.ending.lease.run(), fence = %p.ending.lease.fence(), end = p.ending.end.as_str(), error = %e, "end refused: the lease was lost");
            bump(&c.refused);
        }
        Err(e) => {
            tracing::error!(run = %p.ending.lease.run(), fence = %p.ending.lease.fence(), end = p.ending.end.as_str(), error = %e, "end not committed; the lease will expire");
            bump(&c.failed);
        }
    }
    let report = EndReport {
        lease: &p.ending.lease,
        end: &p.ending.end,
        result: &result,
        by_handler: p.by_handler,
    };
    for observer in &b.observers {
        observer(&report);
    }
    let _ = p.reply.send(result);
}
