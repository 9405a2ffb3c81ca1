//! Retention by itself: a [`Purger`] removes ended runs older than an age, in bounded
//! batches, while it holds a lease of this library.
//!
//! Start one on each host: they take turns under one lease, so the fleet purges with one
//! purger at a time, and when the holder dies the next one takes over within a TTL.

use std::sync::Arc;
use std::time::Duration;

use lease_core::backend::check_purge;
use lease_core::{
    EndedStates, Error, InvalidInput, Kind, LeaseStore, NewRun, Result, Retention, RunId, Ttl,
    WorkerId,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::scope::{RunScope, ScopeConfig};

/// Seven days: how long [`Retention::default`] keeps failed and cancelled runs (River keeps
/// discarded jobs as long), and a common age for [`Retention::all`].
pub const DEFAULT_RETENTION_AGE: Duration = Duration::from_secs(7 * 86_400);

/// How often a [`Purger`] looks for runs to purge unless told otherwise: every minute.
pub const DEFAULT_PURGE_EVERY: Duration = Duration::from_secs(60);

/// The most runs one purge call of a [`Purger`] removes unless told otherwise.
pub const DEFAULT_PURGE_BATCH: usize = 500;

/// The name of a [`Purger`]'s lease run unless told otherwise.
pub const DEFAULT_PURGER_NAME: &str = "lease-purger";

/// The kind of a [`Worker`](crate::Worker)'s purge lease run (see
/// [`WorkerConfig::with_retention`](crate::WorkerConfig::with_retention)): serve no runs of
/// this kind.
pub const PURGER_KIND: &str = "lease-purger";

/// What a [`Purger::run`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PurgerReport {
    /// Times this purger took the purge lease.
    pub held: u64,
    /// Purge calls it made.
    pub batches: u64,
    /// Runs those calls removed.
    pub purged: u64,
    /// Times it stopped purging because its lease had ended (by its local deadline or a
    /// refused renewal) or was about to: before a batch, or while one was out.
    pub stood_down: u64,
}

/// Purges ended runs (completed, failed, cancelled) older than an age while it holds the
/// purge lease.
///
/// The purgers of a fleet take turns under the lease run `name` (default
/// [`DEFAULT_PURGER_NAME`]) in the `leases` store: keep it apart from the store your workers
/// claim from, as for a [`Scheduler`](crate::Scheduler), or a worker would take the lease for
/// a job. The holder, heartbeated by a [`RunScope`], calls
/// [`purge`](LeaseStore::purge) on the `runs` store every period (default
/// [`DEFAULT_PURGE_EVERY`]) in batches of at most `batch` runs until a batch comes back short.
///
/// Before each batch the holder checks its lease on the monotonic clock: a purger that was
/// paused or cut off past its lease's local deadline, or that has less than a third of the TTL
/// left, starts no batch, and stands down until it takes the lease again; it also stops
/// waiting for a batch that is out when its lease ends. A batch already sent may still be
/// applied by the store after another purger took over, so two batches can overlap once,
/// around a takeover. That is safe: a purge removes only ended runs older than the age, each
/// at most once, and raises the store's fence floor so that no fence is issued again. The lease keeps the
/// fleet's purging to one purger's load, not the store's correctness.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use lease_core::{LeaseStore, Ttl, WorkerId};
/// use lease_runtime::{CancellationToken, MemoryLeaseStore, Purger};
///
/// let runs: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
/// let leases: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
/// let purger = Purger::new(runs, leases, WorkerId::new("host-a")?, Ttl::from_secs(30)?)
///     .with_age(Duration::from_secs(86_400))?
///     .with_every(Duration::from_secs(60))?;
/// let shutdown = CancellationToken::new();
/// shutdown.cancel(); // here: stop at once; a service cancels it on SIGTERM
/// let report = purger.run(shutdown).await?;
/// assert_eq!(report.purged, 0);
/// # Ok(()) }
/// ```
pub struct Purger {
    runs: Arc<dyn LeaseStore>,
    leases: Arc<dyn LeaseStore>,
    name: RunId,
    worker: WorkerId,
    ttl: Ttl,
    retention: Retention,
    every: Duration,
    batch: usize,
    lease_kind: Kind,
}

impl std::fmt::Debug for Purger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Purger")
            .field("name", &self.name)
            .field("worker", &self.worker)
            .field("ttl", &self.ttl)
            .field("retention", &self.retention)
            .field("every", &self.every)
            .field("batch", &self.batch)
            .field("lease_kind", &self.lease_kind)
            .finish_non_exhaustive()
    }
}

impl Purger {
    /// A purger of the `runs` store, holding its lease in the `leases` store as `worker` for
    /// `ttl`, with the defaults: [`Retention::default`] (completed runs kept 24 hours, failed
    /// and cancelled ones 7 days), period
    /// [`DEFAULT_PURGE_EVERY`], batch [`DEFAULT_PURGE_BATCH`], name [`DEFAULT_PURGER_NAME`].
    pub fn new(
        runs: Arc<dyn LeaseStore>,
        leases: Arc<dyn LeaseStore>,
        worker: WorkerId,
        ttl: Ttl,
    ) -> Purger {
        Purger {
            runs,
            leases,
            name: RunId::new(DEFAULT_PURGER_NAME).expect("a valid run id"),
            worker,
            ttl,
            retention: Retention::default(),
            every: DEFAULT_PURGE_EVERY,
            batch: DEFAULT_PURGE_BATCH,
            lease_kind: Kind::default(),
        }
    }

    /// Purges ended runs older than `age` (ended this long ago on the store's clock),
    /// whatever their state: [`with_retention`](Purger::with_retention) of
    /// [`Retention::all`].
    ///
    /// # Errors
    /// [`InvalidInput::PurgeAgeTooLong`] over [`MAX_PURGE_AGE`](lease_core::MAX_PURGE_AGE).
    pub fn with_age(self, age: Duration) -> Result<Purger, InvalidInput> {
        self.with_retention(Retention::all(age))
    }

    /// Purges ended runs by `retention`: each state's runs once they ended longer ago than
    /// its age (on the store's clock), none of a state kept for good. One purge per group of
    /// states kept equally long ([`Retention::groups`]), each through
    /// [`purge_ended`](LeaseStore::purge_ended).
    ///
    /// # Errors
    /// [`InvalidInput::PurgeAgeTooLong`] over [`MAX_PURGE_AGE`](lease_core::MAX_PURGE_AGE).
    pub fn with_retention(mut self, retention: Retention) -> Result<Purger, InvalidInput> {
        retention.check()?;
        self.retention = retention;
        Ok(self)
    }

    /// Looks for runs to purge every `every`: 1 s to a day.
    ///
    /// # Errors
    /// [`InvalidInput::WorkerSetting`] naming `every`.
    pub fn with_every(mut self, every: Duration) -> Result<Purger, InvalidInput> {
        Purger::check(Duration::ZERO, every, self.batch)?;
        self.every = every;
        Ok(self)
    }

    /// Checks a purger's settings as the `with_` calls do, for a caller that wants to refuse
    /// them before connecting to anything: `age` at most
    /// [`MAX_PURGE_AGE`](lease_core::MAX_PURGE_AGE), `every` 1 s to a day, `batch` 1 to
    /// [`MAX_BATCH`](lease_core::MAX_BATCH).
    ///
    /// # Errors
    /// The [`InvalidInput`] of the first setting out of range.
    pub fn check(age: Duration, every: Duration, batch: usize) -> Result<(), InvalidInput> {
        check_purge(age, batch)?;
        if every < Duration::from_secs(1) || every > Duration::from_secs(86_400) {
            return Err(InvalidInput::WorkerSetting {
                setting: "every",
                value: format!("{every:?}"),
                rule: "a purger's period must be 1 s to a day",
            });
        }
        Ok(())
    }

    /// Removes at most `batch` runs per purge call: 1 to [`MAX_BATCH`](lease_core::MAX_BATCH).
    ///
    /// # Errors
    /// [`InvalidInput::BatchEmpty`] or [`InvalidInput::BatchTooLarge`].
    pub fn with_batch(mut self, batch: usize) -> Result<Purger, InvalidInput> {
        check_purge(Duration::ZERO, batch)?;
        self.batch = batch;
        Ok(self)
    }

    /// The purge lease's run is `name` instead of [`DEFAULT_PURGER_NAME`] (one per group of
    /// purgers).
    pub fn with_name(mut self, name: RunId) -> Purger {
        self.name = name;
        self
    }

    /// The purge lease's run is of `kind`: with a kind no worker serves (such as
    /// [`PURGER_KIND`]), the lease run can live in the store the workers claim from, and no
    /// worker takes it for a job. This is how a [`Worker`](crate::Worker) with
    /// [retention](crate::WorkerConfig::with_retention) keeps its purge lease.
    pub fn with_lease_kind(mut self, kind: Kind) -> Purger {
        self.lease_kind = kind;
        self
    }

    /// Takes turns at the purge lease and purges while holding it, until `shutdown`: a batch
    /// out then is waited for (each store call is bounded), and the lease is released, so
    /// another purger takes over at once.
    ///
    /// # Errors
    /// A refusal that waiting does not cure: the purge lease run was cancelled, completed,
    /// failed or suspended by an operator, a store error that is not retryable, or a `runs`
    /// store that refuses purges ([`InvalidInput::Unsupported`]; the lease is released
    /// first).
    pub async fn run(self, shutdown: CancellationToken) -> Result<PurgerReport> {
        let mut report = PurgerReport::default();
        while !shutdown.is_cancelled() {
            // A call that hangs (a partition) must not keep the purger from stopping.
            let taken = tokio::select! {
                () = shutdown.cancelled() => break,
                taken = self.take() => taken,
            };
            let wait = match taken {
                Ok(scope) => {
                    report.held += 1;
                    tracing::info!(purger = %self.name, fence = %scope.fence(), "purge lease taken");
                    if let Err(e) = self.hold(&scope, &shutdown, &mut report).await {
                        let _ = scope.release().await;
                        return Err(e);
                    }
                    if shutdown.is_cancelled() {
                        // Best effort: an unreleased lease expires by its TTL.
                        let _ = scope.release().await;
                        break;
                    }
                    tracing::warn!(purger = %self.name, "purge lease lost");
                    Duration::ZERO
                }
                Err(Error::Held { remaining, .. }) => remaining.min(self.ttl.as_duration()),
                Err(Error::Delayed { remaining, .. }) => remaining,
                Err(e) if e.is_retryable() => {
                    tracing::warn!(purger = %self.name, error = %e, "purge lease not taken; retrying");
                    Duration::from_secs(1)
                }
                Err(e) => return Err(e),
            };
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(wait + Duration::from_millis(10)) => {}
            }
        }
        Ok(report)
    }

    async fn take(&self) -> Result<RunScope> {
        let new = NewRun::new(self.name.clone()).with_kind(self.lease_kind.clone());
        match self.leases.create_with(&new).await {
            Ok(_) | Err(Error::AlreadyExists { .. }) => {}
            Err(e) => return Err(e),
        }
        // Not a child of the shutdown: the scope's cancellation means the lease is lost, and a
        // batch out at shutdown is waited for (so that it is counted), then the lease released.
        let config = ScopeConfig::default();
        let scope = RunScope::claim(
            self.leases.clone(),
            &self.name,
            &self.worker,
            self.ttl,
            config,
        )
        .await?;
        // A fenced write naming the holder: the lease run's journal is the purge lease's
        // history, one entry per takeover, each under its holder's fence.
        if let Err(e) = scope
            .append(format!("{} holds the purge lease", self.worker).as_bytes())
            .await
        {
            let _ = scope.release().await;
            return Err(e);
        }
        Ok(scope)
    }

    /// Purges every period while `scope` holds the lease; returns when it does not.
    async fn hold(
        &self,
        scope: &RunScope,
        shutdown: &CancellationToken,
        report: &mut PurgerReport,
    ) -> Result<()> {
        let groups = self.retention.groups();
        loop {
            for &(states, age) in &groups {
                if !self
                    .purge_group(scope, shutdown, report, states, age)
                    .await?
                {
                    return Ok(());
                }
            }
            tokio::select! {
                () = scope.cancelled() => return Ok(()),
                () = shutdown.cancelled() => return Ok(()),
                () = tokio::time::sleep(self.every) => {}
            }
        }
    }

    /// Purges the runs of `states` older than `age` in batches until one comes back short;
    /// whether the purger may go on (it holds the lease, and no shutdown came).
    async fn purge_group(
        &self,
        scope: &RunScope,
        shutdown: &CancellationToken,
        report: &mut PurgerReport,
        states: EndedStates,
        age: Duration,
    ) -> Result<bool> {
        loop {
            if shutdown.is_cancelled() {
                return Ok(false);
            }
            if !self.may_start(scope) {
                report.stood_down += 1;
                tracing::warn!(purger = %self.name, fence = %scope.fence(), "purge lease ended or about to: no batch started");
                return Ok(false);
            }
            report.batches += 1;
            let purged = tokio::select! {
                () = scope.cancelled() => {
                    // The lease ended while the batch was out: stop waiting for it (it may
                    // still apply; see the type's docs).
                    report.stood_down += 1;
                    tracing::warn!(purger = %self.name, fence = %scope.fence(), "purge lease ended during a batch: no more batches");
                    return Ok(false);
                }
                purged = self.runs.purge_ended(states, age, self.batch) => purged,
            };
            match purged {
                Ok(ids) => {
                    report.purged += ids.len() as u64;
                    if !ids.is_empty() {
                        tracing::info!(purger = %self.name, fence = %scope.fence(), ?states, purged = ids.len(), "ended runs purged");
                    }
                    if ids.len() < self.batch {
                        return Ok(true);
                    }
                }
                Err(e @ Error::InvalidInput(_)) => {
                    tracing::error!(purger = %self.name, error = %e, "the store refuses purges; the purger stops");
                    return Err(e);
                }
                Err(e) => {
                    tracing::warn!(purger = %self.name, error = %e, "purge failed; trying again next period");
                    return Ok(true);
                }
            }
        }
    }

    /// Whether a batch may start: the scope holds the lease, with at least a third of the TTL
    /// left before its local deadline, so that the batch ends inside the lease.
    fn may_start(&self, scope: &RunScope) -> bool {
        !scope.is_cancelled() && Instant::now() + self.ttl.as_duration() / 3 < scope.deadline()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lease_core::{MAX_BATCH, MAX_PURGE_AGE};

    #[test]
    fn bad_settings_are_refused_saying_which() {
        let store: Arc<dyn LeaseStore> = Arc::new(crate::MemoryLeaseStore::new());
        let purger = || {
            Purger::new(
                store.clone(),
                store.clone(),
                WorkerId::new("w").unwrap(),
                Ttl::from_secs(5).unwrap(),
            )
        };
        for every in [Duration::from_millis(999), Duration::from_secs(86_401)] {
            let e = purger().with_every(every).unwrap_err();
            assert!(
                matches!(
                    e,
                    InvalidInput::WorkerSetting {
                        setting: "every",
                        ..
                    }
                ),
                "{every:?}: {e}"
            );
        }
        assert!(matches!(
            purger().with_batch(0).unwrap_err(),
            InvalidInput::BatchEmpty
        ));
        assert!(matches!(
            purger().with_batch(MAX_BATCH + 1).unwrap_err(),
            InvalidInput::BatchTooLarge { .. }
        ));
        assert!(matches!(
            purger()
                .with_age(MAX_PURGE_AGE + Duration::from_secs(1))
                .unwrap_err(),
            InvalidInput::PurgeAgeTooLong { .. }
        ));
        let ok = purger()
            .with_age(Duration::ZERO)
            .and_then(|p| p.with_every(Duration::from_secs(1)))
            .and_then(|p| p.with_batch(MAX_BATCH))
            .unwrap();
        assert_eq!(
            (ok.retention, ok.every, ok.batch),
            (
                Retention::all(Duration::ZERO),
                Duration::from_secs(1),
                MAX_BATCH
            )
        );
        assert_eq!(purger().retention, Retention::default());
    }
}
