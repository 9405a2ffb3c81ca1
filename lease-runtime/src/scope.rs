//! `RunScope`: drives one claimed lease with heartbeats and stops the run's work before anyone
//! else can claim it.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use lease_core::{
    Error, Fence, InvalidInput, JournalEntry, Lease, LeaseStore, Result, RunId, Ttl, WorkerId,
};
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::heartbeats::{Heartbeats, Hub};

/// Timing of a [`RunScope`]: how often it heartbeats and how much safety margin its local
/// deadline keeps. Defaults: heartbeat every TTL/3, margin TTL/10, each scope renewing on its
/// own (see [`ScopeConfig::with_heartbeats`] for a worker-wide batched heartbeat).
#[derive(Clone, Debug, Default)]
pub struct ScopeConfig {
    heartbeat: Option<Duration>,
    margin: Option<Duration>,
    parent: Option<CancellationToken>,
    heartbeats: Option<Heartbeats>,
    max_attempts: Option<u64>,
}

impl ScopeConfig {
    /// Heartbeat every `interval` instead of TTL/3.
    pub fn with_heartbeat(mut self, interval: Duration) -> Self {
        self.heartbeat = Some(interval);
        self
    }

    /// Keep `margin` between the local deadline and the earliest instant the store's expiry can
    /// fall, instead of TTL/10. It absorbs the difference in clock *rates* between worker and store
    /// and the time to stop the run's work. At least [`min_margin`] (TTL/20, 10 ms at the least).
    pub fn with_margin(mut self, margin: Duration) -> Self {
        self.margin = Some(margin);
        self
    }

    /// Make the scope's token a child of `parent` (typically the worker's shutdown token), so
    /// cancelling `parent` cancels the scope.
    pub fn with_parent(mut self, parent: CancellationToken) -> Self {
        self.parent = Some(parent);
        self
    }

    /// Renew through the worker-wide `hub` instead of a heartbeat per scope: the hub renews
    /// every registered lease with [`LeaseStore::renew_many`] each of its ticks, which replaces
    /// [`with_heartbeat`](ScopeConfig::with_heartbeat) as the scope's heartbeat interval. The
    /// scope keeps its own local deadline, rejection and ending behaviour. The hub must renew
    /// through the scope's store.
    pub fn with_heartbeats(mut self, hub: Heartbeats) -> Self {
        self.heartbeats = Some(hub);
        self
    }

    /// The run's attempt budget: [`RunScope::claim`] and [`RunScope::claim_next`] fail a run
    /// claimed past `n` attempts ([`Lease::attempt`]: claims since it was created or resumed,
    /// less the voluntary ends) instead of handing it out, so a run whose holder crashes or
    /// hangs on every attempt stops. Unlimited by default (`0` counts as 1).
    pub fn with_max_attempts(mut self, n: u64) -> Self {
        self.max_attempts = Some(n.max(1));
        self
    }

    /// Checks that the heartbeat fits inside `ttl` minus the margin.
    pub(crate) fn check(&self, ttl: Ttl) -> Result<(), InvalidInput> {
        self.timing(ttl).map(|_| ())
    }

    /// Resolves the defaults against `ttl` and checks that the heartbeat fits inside the
    /// deadline window (`ttl - margin`).
    fn timing(&self, ttl: Ttl) -> Result<Timing, InvalidInput> {
        let ttl = ttl.as_duration();
        let interval = match &self.heartbeats {
            Some(hub) => hub.tick(),
            None => self.heartbeat.unwrap_or(ttl / 3),
        };
        let margin = self.margin.unwrap_or(ttl / 10);
        let least = min_margin(ttl);
        if margin < least {
            return Err(InvalidInput::MarginTooSmall {
                ttl,
                margin,
                min: least,
            });
        }
        let window = ttl.saturating_sub(margin);
        // A renewal sent one interval after the last good one may hang for a whole interval
        // (its timeout) and be retried a quarter interval later: all of that must happen before
        // the local deadline, so one failed renewal never costs the lease.
        if interval.is_zero() || window.is_zero() || interval * 9 / 4 >= window {
            return Err(InvalidInput::ScopeTiming {
                ttl,
                heartbeat: interval,
                margin,
            });
        }
        Ok(Timing { interval, window })
    }
}

/// The reason a run claimed past its budget is failed with.
pub(crate) fn exhausted_reason(attempt: u64, max: u64) -> String {
    format!(
        "claimed {attempt} times without finishing (max_attempts {max}): every earlier attempt \
         failed, timed out, or its holder vanished (a crash, a lost lease)"
    )
}

/// Fails `lease`'s run if it was claimed past `max` attempts, and says so; `None` when it may
/// run.
async fn fail_if_exhausted(
    store: &dyn LeaseStore,
    lease: &Lease,
    max: Option<u64>,
) -> Result<Option<Error>> {
    let Some(max) = max.filter(|max| lease.attempt() > *max) else {
        return Ok(None);
    };
    let reason = exhausted_reason(lease.attempt() - 1, max);
    tracing::warn!(run = %lease.run(), attempt = lease.attempt(), max, "attempt budget spent; failing the run");
    lease_core::LeaseStoreExt::fail(store, lease, &reason).await?;
    Ok(Some(Error::AttemptsExhausted {
        run: lease.run().clone(),
        attempts: lease.attempt() - 1,
        max,
    }))
}

/// The smallest safety margin a scope accepts for `ttl`: TTL/20, and never under 10 ms.
///
/// The margin absorbs timer lateness (a tokio timer fires up to a millisecond or so late, more
/// on a loaded host), the time to stop the run's work, and any difference in clock *rate*
/// between worker and store. Below this the local deadline can fall after the store's expiry.
pub fn min_margin(ttl: Duration) -> Duration {
    (ttl / 20).max(Duration::from_millis(10))
}

#[derive(Clone, Copy, Debug)]
struct Timing {
    interval: Duration,
    /// TTL minus the safety margin: how long after a renewal is *sent* the scope may work.
    window: Duration,
}

/// Why a [`RunScope`] was cancelled.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum CancelReason {
    /// The store rejected a renewal (or an end of the lease) with this verdict, for example
    /// [`Error::StaleFence`]: the run belongs to someone else now.
    Rejected(Arc<Error>),
    /// No renewal succeeded in time: the local deadline (last successful send + TTL − margin)
    /// passed, whether renewals failed, hung or never returned.
    DeadlineExceeded {
        /// The local deadline that passed.
        deadline: Instant,
        /// The last renewal failure seen, if any.
        last_error: Option<String>,
    },
    /// [`RunScope::release`] succeeded.
    Released,
    /// [`RunScope::suspend`] succeeded.
    Suspended,
    /// [`RunScope::complete`] succeeded.
    Completed,
    /// [`RunScope::fail`] succeeded (or a worker ended the lease with
    /// [`End::Fail`](lease_core::End::Fail)).
    Failed,
    /// A handler's own committed end cancelled the run
    /// ([`End::Committed`](lease_core::End::Committed) with
    /// [`Ended::Cancelled`](lease_core::Ended::Cancelled)). A run cancelled by someone else shows
    /// as [`Rejected`](CancelReason::Rejected) with that verdict.
    Cancelled,
    /// The parent token was cancelled (worker shutdown).
    Shutdown,
}

impl CancelReason {
    /// A bounded label for metrics: `rejected`, `deadline`, `released`, `suspended`,
    /// `completed`, `failed`, `cancelled` or `shutdown`.
    pub fn label(&self) -> &'static str {
        match self {
            CancelReason::Rejected(_) => "rejected",
            CancelReason::DeadlineExceeded { .. } => "deadline",
            CancelReason::Released => "released",
            CancelReason::Suspended => "suspended",
            CancelReason::Completed => "completed",
            CancelReason::Failed => "failed",
            CancelReason::Cancelled => "cancelled",
            CancelReason::Shutdown => "shutdown",
        }
    }
}

impl fmt::Display for CancelReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CancelReason::Rejected(e) => write!(f, "renewal rejected: {e}"),
            CancelReason::DeadlineExceeded {
                last_error: Some(e),
                ..
            } => write!(
                f,
                "local deadline passed without a renewal (last error: {e})"
            ),
            CancelReason::DeadlineExceeded { .. } => {
                f.write_str("local deadline passed without a renewal")
            }
            CancelReason::Released => f.write_str("released"),
            CancelReason::Suspended => f.write_str("suspended"),
            CancelReason::Completed => f.write_str("completed"),
            CancelReason::Failed => f.write_str("failed"),
            CancelReason::Cancelled => f.write_str("cancelled"),
            CancelReason::Shutdown => f.write_str("shut down"),
        }
    }
}

/// State shared between a scope and its heartbeat task, or the worker-wide [`Heartbeats`] hub.
pub(crate) struct Shared {
    pub(crate) store: Arc<dyn LeaseStore>,
    lease: Mutex<Lease>,
    pub(crate) token: CancellationToken,
    reason: OnceLock<(Instant, CancelReason)>,
    deadline: Mutex<Instant>,
    renewals: AtomicU64,
    timing: Timing,
    /// Serializes renewals with the writes that end the lease, so a renewal never races a
    /// suspend and turns a clean suspension into a "rejected" cancellation.
    ending: tokio::sync::Mutex<()>,
    /// The latest renewal failure the hub saw, for [`CancelReason::DeadlineExceeded`].
    hub_error: Mutex<Option<Arc<str>>>,
    /// The hub this scope is registered with, and its id there.
    registration: OnceLock<(Weak<Hub>, u64)>,
    /// An end of the lease that was sent and not answered (it may have been applied).
    unanswered_end: Mutex<Option<lease_core::Ended>>,
}

impl Shared {
    pub(crate) fn lease(&self) -> Lease {
        self.lease.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a successful renewal that was sent at `sent`, through `via` (`scope` or `hub`).
    pub(crate) fn renewed(&self, via: &'static str, sent: Instant, lease: Lease) {
        {
            let mut held = self.lease.lock().unwrap_or_else(|e| e.into_inner());
            // A renewal moves the expiry; the attempt is the claim's.
            let attempt = held.attempt();
            *held = lease.with_attempt(attempt);
        }
        let mut deadline = self.deadline.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        crate::observe::renewal(
            via,
            now.saturating_duration_since(sent),
            deadline.saturating_duration_since(now),
        );
        // A late answer to an older send must not move the deadline back... or forward past
        // what its send instant justifies.
        *deadline = (*deadline).max(sent + self.timing.window);
        self.renewals.fetch_add(1, Ordering::Relaxed);
        drop(deadline);
        *self.hub_error.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Records a renewal (by the hub) that failed without a verdict; nothing is extended.
    pub(crate) fn failed(&self, why: Arc<str>) {
        *self.hub_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
    }

    /// Whether a write that ends the lease (suspend, complete, release) is in flight.
    pub(crate) fn is_ending(&self) -> bool {
        self.ending.try_lock().is_err()
    }

    /// Cancels the scope; the first reason wins.
    pub(crate) fn cancel(&self, reason: CancelReason) {
        let lease = self.lease();
        if self.reason.set((Instant::now(), reason.clone())).is_ok() {
            metrics::counter!(crate::observe::SCOPE_CANCELLATIONS, "reason" => reason.label())
                .increment(1);
            match &reason {
                CancelReason::Rejected(_) | CancelReason::DeadlineExceeded { .. } => {
                    tracing::warn!(run = %lease.run(), fence = %lease.fence(), %reason, "run scope cancelled")
                }
                _ => {
                    tracing::debug!(run = %lease.run(), fence = %lease.fence(), %reason, "run scope ended")
                }
            }
        }
        self.token.cancel();
        // Leave the hub at once, so it never renews an ended lease.
        if let Some((hub, id)) = self.registration.get() {
            if let Some(hub) = hub.upgrade() {
                hub.unregister(*id);
            }
        }
    }
}

/// Drives one claimed lease: heartbeats it, keeps a local deadline on the monotonic clock, and
/// cancels a [`CancellationToken`] the run's work observes as soon as the lease may be lost.
///
/// - It heartbeats every TTL/3 by default ([`ScopeConfig`]).
/// - Its **local deadline** is the instant the last successful renewal (or the claim) was
///   *sent*, plus the TTL, minus a safety margin. The store sets its expiry after it receives
///   the request, so its expiry is never earlier than that instant.
/// - A renewal the store rejects cancels the scope at once with [`CancelReason::Rejected`].
/// - A renewal that fails or hangs is retried, but when the local deadline passes the scope is
///   cancelled with [`CancelReason::DeadlineExceeded`] **even if the renewal never returns**:
///   the worker stops before anyone else can claim the run. Fencing covers writes already in
///   flight.
/// - [`suspend`](RunScope::suspend), [`complete`](RunScope::complete) and
///   [`release`](RunScope::release) stop the heartbeat; a scope never heartbeats a suspended run.
/// - The scope never answers a write itself: [`append`](RunScope::append) and the ends of the
///   lease go to the store with the fence, and the store's verdict is returned.
/// - Dropping the scope cancels its token and stops the heartbeat.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
/// use std::sync::Arc;
/// use lease_core::{LeaseStore, RunId, Ttl, WorkerId};
/// use lease_runtime::{MemoryLeaseStore, RunScope, ScopeConfig};
///
/// let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
/// let run = RunId::new("order-42")?;
/// store.create(&run).await?;
/// let worker = WorkerId::new("worker-a")?;
/// let scope = RunScope::claim(store, &run, &worker, Ttl::from_secs(30)?, ScopeConfig::default()).await?;
/// let token = scope.token();
/// for step in 0..3 {
///     if token.is_cancelled() {
///         return Ok(()); // the lease may be lost: stop, someone else may own the run now
///     }
///     scope.append(format!("step {step}").as_bytes()).await?; // fenced by the store
/// }
/// scope.complete().await?;
/// # Ok(()) }
/// ```
pub struct RunScope {
    shared: Arc<Shared>,
    run: RunId,
    _guard: DropGuard,
}

impl RunScope {
    /// Claims `run` and starts driving the lease. The local deadline counts from the instant
    /// the claim was sent.
    ///
    /// # Errors
    /// [`InvalidInput::ScopeTiming`] if the configured heartbeat does not fit inside TTL minus
    /// margin (checked before claiming), every error of [`LeaseStore::claim`], and
    /// [`Error::AttemptsExhausted`] for a run claimed past the
    /// [budget](ScopeConfig::with_max_attempts) (it is failed with that reason).
    pub async fn claim(
        store: Arc<dyn LeaseStore>,
        run: &RunId,
        worker: &WorkerId,
        ttl: Ttl,
        config: ScopeConfig,
    ) -> Result<RunScope> {
        config.timing(ttl)?;
        let sent = Instant::now();
        let lease = store.claim(run, worker, ttl).await?;
        if let Some(exhausted) = fail_if_exhausted(&*store, &lease, config.max_attempts).await? {
            return Err(exhausted);
        }
        Ok(Self::from_lease(store, lease, sent, config)?)
    }

    /// Claims up to `max` runs with [`LeaseStore::claim_next`] and drives each in its own scope.
    /// A run claimed past the [budget](ScopeConfig::with_max_attempts) is failed with that
    /// reason and left out.
    ///
    /// # Errors
    /// As [`RunScope::claim`] and [`LeaseStore::claim_next`].
    pub async fn claim_next(
        store: Arc<dyn LeaseStore>,
        worker: &WorkerId,
        ttl: Ttl,
        max: usize,
        config: ScopeConfig,
    ) -> Result<Vec<RunScope>> {
        config.timing(ttl)?;
        let sent = Instant::now();
        let leases = store.claim_next(worker, ttl, max).await?;
        let mut scopes = Vec::with_capacity(leases.len());
        for lease in leases {
            if fail_if_exhausted(&*store, &lease, config.max_attempts)
                .await?
                .is_some()
            {
                continue;
            }
            scopes.push(Self::from_lease(
                store.clone(),
                lease,
                sent,
                config.clone(),
            )?);
        }
        Ok(scopes)
    }

    /// Drives a lease obtained elsewhere. `sent` must be the instant its claim (or its latest
    /// renewal) was sent: the local deadline is `sent + ttl - margin`.
    ///
    /// Must be called inside a tokio runtime: it spawns the heartbeat task.
    ///
    /// # Errors
    /// [`InvalidInput::ScopeTiming`].
    pub fn from_lease(
        store: Arc<dyn LeaseStore>,
        lease: Lease,
        sent: Instant,
        config: ScopeConfig,
    ) -> Result<RunScope, InvalidInput> {
        let timing = config.timing(lease.ttl())?;
        let token = match &config.parent {
            Some(parent) => parent.child_token(),
            None => CancellationToken::new(),
        };
        let run = lease.run().clone();
        let shared = Arc::new(Shared {
            store,
            lease: Mutex::new(lease),
            token: token.clone(),
            reason: OnceLock::new(),
            deadline: Mutex::new(sent + timing.window),
            renewals: AtomicU64::new(0),
            timing,
            ending: tokio::sync::Mutex::new(()),
            hub_error: Mutex::new(None),
            registration: OnceLock::new(),
            unanswered_end: Mutex::new(None),
        });
        match &config.heartbeats {
            Some(hub) => {
                let hub = hub.hub().clone();
                let id = hub.register(shared.clone());
                let _ = shared.registration.set((Arc::downgrade(&hub), id));
                tokio::spawn(deadline_watch(shared.clone(), hub, id));
            }
            None => {
                tokio::spawn(heartbeat(shared.clone(), sent));
            }
        }
        metrics::gauge!(crate::observe::LEASES_HELD).increment(1.0);
        Ok(RunScope {
            shared,
            run,
            _guard: token.drop_guard(),
        })
    }

    /// The run this scope drives.
    pub fn run(&self) -> &RunId {
        &self.run
    }

    /// The lease as of the latest successful renewal.
    pub fn lease(&self) -> Lease {
        self.shared.lease()
    }

    /// The fence every write of this scope presents.
    pub fn fence(&self) -> Fence {
        self.shared.lease().fence()
    }

    /// A child of the scope's token, for the run's tasks: cancelled when the scope is.
    pub fn token(&self) -> CancellationToken {
        self.shared.token.child_token()
    }

    /// Completes when the scope is cancelled.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn cancelled(&self) {
        self.shared.token.cancelled().await
    }

    /// Whether the scope is cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.shared.token.is_cancelled()
    }

    /// Why the scope was cancelled, and when (on the monotonic clock); `None` while it runs.
    pub fn cancel_reason(&self) -> Option<(Instant, CancelReason)> {
        match self.shared.reason.get() {
            Some(reason) => Some(reason.clone()),
            // Cancelled from outside: the parent token.
            None if self.is_cancelled() => Some((Instant::now(), CancelReason::Shutdown)),
            None => None,
        }
    }

    /// The current local deadline: the scope cancels itself when it passes without a renewal.
    pub fn deadline(&self) -> Instant {
        self.shared.deadline()
    }

    /// How many renewals have succeeded.
    pub fn renewals(&self) -> u64 {
        self.shared.renewals.load(Ordering::Relaxed)
    }

    /// The store this scope writes to.
    pub fn store(&self) -> &Arc<dyn LeaseStore> {
        &self.shared.store
    }

    /// Appends to the run's journal under this scope's fence; the store's verdict is returned,
    /// whether or not the scope is cancelled.
    ///
    /// # Errors
    /// As [`LeaseStore::append`].
    pub async fn append(&self, payload: &[u8]) -> Result<JournalEntry> {
        self.shared.store.append(&self.lease(), payload).await
    }

    /// Suspends the run and stops the heartbeat. On a verdict error the scope is cancelled with
    /// it; on an unavailable store the scope keeps heartbeating and the call may be retried.
    /// A retry that finds the first attempt was applied (the store answers `LeaseEnded` with
    /// this fence and the same end) returns `Ok(())`.
    ///
    /// # Errors
    /// As [`LeaseStore::suspend`].
    pub async fn suspend(&self) -> Result<()> {
        self.end(CancelReason::Suspended).await
    }

    /// Completes the run and stops the heartbeat. Errors as for [`RunScope::suspend`].
    ///
    /// # Errors
    /// As [`LeaseStore::complete`].
    pub async fn complete(&self) -> Result<()> {
        self.end(CancelReason::Completed).await
    }

    /// Releases the run and stops the heartbeat. Errors as for [`RunScope::suspend`].
    ///
    /// # Errors
    /// As [`LeaseStore::release`].
    pub async fn release(&self) -> Result<()> {
        self.end(CancelReason::Released).await
    }

    /// Gives the run back, not claimable before `delay` has passed on the store's clock
    /// ([`End::RetryAfter`](lease_core::End::RetryAfter)), and stops the heartbeat. Errors as for
    /// [`RunScope::suspend`].
    ///
    /// # Errors
    /// As [`LeaseStore::end_many`] for one item; [`Error::InvalidInput`](lease_core::Error::InvalidInput)
    /// for a delay over [`MAX_RETRY_DELAY`](lease_core::MAX_RETRY_DELAY).
    pub async fn retry_after(&self, delay: Duration) -> Result<()> {
        self.end_one(CancelReason::Released, lease_core::End::RetryAfter(delay))
            .await
    }

    /// This attempt failed ([`End::AttemptFailed`](lease_core::End::AttemptFailed)): gives the run
    /// back, not claimable before `retry_after` has passed on the store's clock, with the
    /// attempt counted against the run's budget; stops the heartbeat. Errors as for
    /// [`RunScope::suspend`].
    ///
    /// # Errors
    /// As [`LeaseStore::end_many`] for one item; [`Error::InvalidInput`](lease_core::Error::InvalidInput)
    /// for a delay over [`MAX_RETRY_DELAY`](lease_core::MAX_RETRY_DELAY) or a reason
    /// [`check_reason`](lease_core::backend::check_reason) refuses.
    pub async fn attempt_failed(&self, retry_after: Duration, reason: &str) -> Result<()> {
        let end = lease_core::End::AttemptFailed {
            retry_after,
            reason: reason.to_owned(),
        };
        self.end_one(CancelReason::Released, end).await
    }

    /// Gives up on the run ([`End::Fail`](lease_core::End::Fail)): failed with `reason` until an
    /// operator resumes it; stops the heartbeat. Errors as for [`RunScope::suspend`].
    ///
    /// # Errors
    /// As [`LeaseStore::end_many`] for one item; [`Error::InvalidInput`](lease_core::Error::InvalidInput)
    /// for a reason over [`MAX_REASON_BYTES`](lease_core::MAX_REASON_BYTES).
    pub async fn fail(&self, reason: &str) -> Result<()> {
        self.end_one(
            CancelReason::Failed,
            lease_core::End::Fail(reason.to_owned()),
        )
        .await
    }

    async fn end_one(&self, how: CancelReason, end: lease_core::End) -> Result<()> {
        // Refused before the scope is touched: bad input changes nothing.
        let probe = lease_core::Ending::new(self.lease(), end.clone());
        lease_core::backend::check_end_batch(std::slice::from_ref(&probe))?;
        let store = self.shared.store.clone();
        self.end_with(how, |lease| async move {
            lease_core::LeaseStoreExt::end_one(&*store, &lease, end).await
        })
        .await
    }

    async fn end(&self, how: CancelReason) -> Result<()> {
        let store = self.shared.store.clone();
        self.end_with(how.clone(), |lease| async move {
            match how {
                CancelReason::Suspended => store.suspend(&lease).await,
                CancelReason::Completed => store.complete(&lease).await,
                _ => store.release(&lease).await,
            }
        })
        .await
    }

    /// Ends the lease through `write` (given the current lease), serialized with renewals as
    /// the scope's own ends are: the heartbeat skips the lease while the write is in flight,
    /// and the write's verdict decides the scope. The [`Worker`](crate::Worker) ends leases
    /// this way through its group-committed batches.
    pub(crate) async fn end_with<F, Fut>(&self, how: CancelReason, write: F) -> Result<()>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: std::future::Future<Output = Result<()>>,
    {
        let _serial = self.shared.ending.lock().await;
        let lease = self.lease();
        let wanted = match how {
            CancelReason::Suspended => Some(lease_core::Ended::Suspended),
            CancelReason::Completed => Some(lease_core::Ended::Completed),
            CancelReason::Released => Some(lease_core::Ended::Released),
            CancelReason::Failed => Some(lease_core::Ended::Failed),
            CancelReason::Cancelled => Some(lease_core::Ended::Cancelled),
            _ => None,
        };
        let mut result = write(lease.clone()).await;
        let mut unanswered = self
            .shared
            .unanswered_end
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match &result {
            // A retry of an end whose earlier attempt went unanswered: the store saying the lease
            // ended this very way under this very fence means that attempt was applied (only
            // this lease's holder can end the run under its fence).
            Err(Error::LeaseEnded { fence, ended, .. })
                if *unanswered == wanted
                    && wanted == Some(*ended)
                    && *fence == lease.fence().get() =>
            {
                result = Ok(());
            }
            // A definite answer that nothing was written (the lease still held).
            Err(Error::EffectFailed { .. }) => {}
            Err(e) if !e.is_verdict() => *unanswered = wanted,
            _ => {}
        }
        drop(unanswered);
        match &result {
            Ok(()) => self.shared.cancel(how),
            Err(e) if e.is_verdict() => self
                .shared
                .cancel(CancelReason::Rejected(Arc::new(e.duplicate()))),
            Err(_) => {}
        }
        result
    }
}

impl Drop for RunScope {
    fn drop(&mut self) {
        metrics::gauge!(crate::observe::LEASES_HELD).decrement(1.0);
    }
}

impl fmt::Debug for RunScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunScope")
            .field("lease", &self.lease())
            .field("cancelled", &self.is_cancelled())
            .finish_non_exhaustive()
    }
}

/// The per-scope heartbeat: renews every interval, retries failures, and cancels the scope on a
/// verdict or at the local deadline, whichever comes first.
async fn heartbeat(shared: Arc<Shared>, claim_sent: Instant) {
    let Timing { interval, .. } = shared.timing;
    // After a failure, retry sooner than the regular interval, but not in a tight loop.
    let retry = (interval / 4).max(Duration::from_millis(1));
    let mut next = claim_sent + interval;
    let mut last_error: Option<String> = None;
    loop {
        let deadline = shared.deadline();
        let expired = || CancelReason::DeadlineExceeded {
            deadline,
            last_error: last_error.clone(),
        };
        tokio::select! {
            biased;
            _ = shared.token.cancelled() => break,
            _ = sleep_until(deadline) => { shared.cancel(expired()); break; }
            _ = sleep_until(next) => {}
        }
        let outcome = tokio::select! {
            biased;
            _ = shared.token.cancelled() => break,
            _ = sleep_until(deadline) => { shared.cancel(expired()); break; }
            outcome = renew_once(&shared, interval) => outcome,
        };
        match outcome {
            Ok(()) => {
                last_error = None;
                // Scheduled from the send, not the answer: a slow but successful renewal must
                // not push the next one (and its retry) past the deadline it just set.
                next = (next + interval).max(Instant::now());
                next = next.min(shared.deadline());
            }
            Err(e) if e.ends_lease() => {
                shared.cancel(CancelReason::Rejected(Arc::new(e)));
                break;
            }
            Err(e) => {
                let lease = shared.lease();
                tracing::warn!(run = %lease.run(), fence = %lease.fence(), error = %e, "heartbeat failed; retrying");
                last_error = Some(e.to_string());
                next = Instant::now() + retry;
            }
        }
    }
}

/// The deadline watch of a scope renewed by a [`Heartbeats`] hub: cancels it when its local
/// deadline passes without a renewal, whether the hub's call failed, hung or never returned,
/// and takes it off the hub once it is cancelled for any reason.
async fn deadline_watch(shared: Arc<Shared>, hub: Arc<Hub>, id: u64) {
    loop {
        let deadline = shared.deadline();
        tokio::select! {
            biased;
            _ = shared.token.cancelled() => break,
            _ = sleep_until(deadline) => {}
        }
        // The hub may have moved the deadline while we slept.
        if shared.deadline() <= Instant::now() {
            let last_error = shared
                .hub_error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_deref()
                .map(str::to_owned);
            shared.cancel(CancelReason::DeadlineExceeded {
                deadline,
                last_error,
            });
            break;
        }
    }
    hub.unregister(id);
}

/// One renewal attempt, serialized with the ends of the lease and bounded by the heartbeat
/// interval, so a call stuck on a dead connection is abandoned and a fresh one sent.
async fn renew_once(shared: &Shared, interval: Duration) -> Result<()> {
    let _serial = shared.ending.lock().await;
    if shared.token.is_cancelled() {
        return Ok(());
    }
    let lease = shared.lease();
    let sent = Instant::now();
    match tokio::time::timeout(interval, shared.store.renew(&lease)).await {
        Ok(Ok(renewed)) => {
            shared.renewed("scope", sent, renewed);
            Ok(())
        }
        Ok(Err(e)) => Err(e),
        Err(_) => Err(Error::unavailable(
            "heartbeat",
            format!("renewal did not answer within {interval:?}"),
        )),
    }
}
