//! Periodic runs: a [`Schedule`] of ticks, and the [`Scheduler`] that enqueues one run per tick
//! while it holds a lease of this library.
//!
//! A tick's run has an id derived from the tick (`{name}@{unix seconds}`), so however many
//! schedulers run, however late or paused, a tick's run is created at most once: a second
//! create of the id is refused as [`AlreadyExists`](lease_core::Error::AlreadyExists). The
//! schedulers of one name take turns under one lease (the run `{name}` in a store of their
//! own), so one of them does the work; the one that takes over after a crash or a partition
//! enqueues the ticks the last holder missed, up to a catch-up window, so no tick is skipped.

mod progress;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use progress::{Progress, ROTATE_AFTER};

use lease_core::{
    Error, InvalidInput, LeaseStore, NewRun, Result, RunId, Ttl, WorkerId, MAX_BATCH, MAX_ID_BYTES,
};
use tokio_util::sync::CancellationToken;

use crate::scope::{RunScope, ScopeConfig};

/// The longest interval of [`Schedule::every`]: a year.
pub const MAX_INTERVAL: Duration = Duration::from_secs(366 * 86_400);

/// The longest schedule name: room is kept for `@` and the tick's 20 digits in each run id.
pub const MAX_SCHEDULE_NAME_BYTES: usize = MAX_ID_BYTES - 21;

/// When a [`Scheduler`] enqueues runs: every whole number of seconds (ticks aligned to the Unix
/// epoch, so every scheduler of a name agrees on them), or a cron expression (the `cron`
/// feature; UTC; five fields, or six with seconds).
///
/// ```
/// use std::time::Duration;
/// use lease_runtime::Schedule;
/// let every = Schedule::every(Duration::from_secs(60))?;
/// assert_eq!(every.ticks(119, 300, 10), vec![120, 180, 240, 300]);
/// assert!(Schedule::every(Duration::from_millis(1500)).is_err()); // whole seconds
/// # Ok::<(), lease_core::InvalidInput>(())
/// ```
#[derive(Clone, Debug)]
pub enum Schedule {
    /// A tick every this many seconds since the Unix epoch.
    Every(u64),
    /// A tick at each time the expression matches, in UTC.
    #[cfg(feature = "cron")]
    Cron(Box<croner::Cron>),
}

impl Schedule {
    /// A tick every `interval`: whole seconds, 1 s to [`MAX_INTERVAL`].
    ///
    /// # Errors
    /// [`InvalidInput::Schedule`].
    pub fn every(interval: Duration) -> Result<Schedule, InvalidInput> {
        let secs = interval.as_secs();
        if interval.subsec_nanos() != 0 || secs == 0 || interval > MAX_INTERVAL {
            return Err(InvalidInput::Schedule {
                reason: format!(
                    "interval {interval:?} must be a whole number of seconds from 1 s to {} days",
                    MAX_INTERVAL.as_secs() / 86_400
                ),
            });
        }
        Ok(Schedule::Every(secs))
    }

    /// A tick at each time `expr` matches, in UTC: five fields (minute to weekday), or six
    /// with seconds first; `L`, `#` and `W` as [croner](https://docs.rs/croner) reads them.
    ///
    /// # Errors
    /// [`InvalidInput::Schedule`] saying why the expression does not parse.
    #[cfg(feature = "cron")]
    pub fn cron(expr: &str) -> Result<Schedule, InvalidInput> {
        let parsed = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Optional)
            .build()
            .parse(expr)
            .map_err(|e| InvalidInput::Schedule {
                reason: format!("cron expression {expr:?}: {e}"),
            })?;
        Ok(Schedule::Cron(Box::new(parsed)))
    }

    /// The ticks after `after` up to `until` (Unix seconds, both in UTC), at most `max`, oldest
    /// first.
    pub fn ticks(&self, after: u64, until: u64, max: usize) -> Vec<u64> {
        let mut out = Vec::new();
        let mut at = after;
        while out.len() < max {
            match self.next_after(at) {
                Some(next) if next <= until => {
                    out.push(next);
                    at = next;
                }
                _ => break,
            }
        }
        out
    }

    /// The first tick after `after` (Unix seconds), if any.
    pub fn next_after(&self, after: u64) -> Option<u64> {
        match self {
            Schedule::Every(secs) => (after / secs).checked_add(1)?.checked_mul(*secs),
            #[cfg(feature = "cron")]
            Schedule::Cron(cron) => {
                let from = chrono::DateTime::from_timestamp(i64::try_from(after).ok()?, 0)?;
                let next = cron.find_next_occurrence(&from, false).ok()?;
                u64::try_from(next.timestamp()).ok()
            }
        }
    }
}

/// What a [`Scheduler::run`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SchedulerReport {
    /// Times this scheduler took the schedule's lease.
    pub held: u64,
    /// Tick runs it created.
    pub created: u64,
    /// Tick runs it found created already (by another scheduler, or itself before a retry).
    pub existed: u64,
}

/// Enqueues one run per tick of a [`Schedule`] while it holds the schedule's lease.
///
/// Start one on each of several hosts: they take turns under the lease `{name}` in the
/// `leases` store (keep it apart from the store your workers claim from, or a worker would
/// take the lease for a job), heartbeated by a [`RunScope`]. The holder creates, at each tick,
/// the run `{name}@{tick}` in the `runs` store (with the payload, if set); its id makes a
/// second create of the tick refused, so a tick is enqueued once however many schedulers run.
/// A scheduler that takes the lease over enqueues the ticks of the last
/// [catch-up](Scheduler::with_catch_up) window first (those there already are refused by id),
/// but never a tick from before the schedule first started, nor one at or before the last
/// tick an earlier holder recorded: the lease run's journal records both, the second before
/// each batch is created, under the holder's fence. So a tick runs once whatever retention
/// does: a tick run completed and purged inside the window is not created again. A holder
/// that stopped between its record and its create leaves those ticks uncreated (at most
/// once, never twice); the next holder logs it. Ticks are read on the holder's clock (UTC); a
/// tick's run is created when that clock has reached it.
///
/// The lease run's journal grows by an entry per batch, and is started afresh every thousand
/// entries (completed, removed with [`purge_ids`](LeaseStore::purge_ids), and created again
/// with what it recorded as payload): a schedule's storage stays bounded. To stop a schedule,
/// **cancel** its lease run (a completed one is taken for such a restart).
pub struct Scheduler {
    runs: Arc<dyn LeaseStore>,
    leases: Arc<dyn LeaseStore>,
    name: String,
    schedule: Schedule,
    worker: WorkerId,
    ttl: Ttl,
    catch_up: Duration,
    payload: Option<Arc<[u8]>>,
    kind: lease_core::Kind,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("name", &self.name)
            .field("schedule", &self.schedule)
            .field("worker", &self.worker)
            .field("ttl", &self.ttl)
            .field("catch_up", &self.catch_up)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl Scheduler {
    /// A scheduler of `name` (a run id of at most [`MAX_SCHEDULE_NAME_BYTES`]), holding its
    /// lease as `worker` for `ttl`. The catch-up window defaults to twice the TTL plus a
    /// minute: longer than a crashed holder's lease can keep the others waiting.
    ///
    /// # Errors
    /// [`InvalidInput`] for a bad name.
    pub fn new(
        runs: Arc<dyn LeaseStore>,
        leases: Arc<dyn LeaseStore>,
        name: &str,
        schedule: Schedule,
        worker: WorkerId,
        ttl: Ttl,
    ) -> Result<Scheduler, InvalidInput> {
        Scheduler::check_name(name)?;
        Ok(Scheduler {
            runs,
            leases,
            name: name.to_owned(),
            schedule,
            worker,
            ttl,
            catch_up: ttl.as_duration() * 2 + Duration::from_secs(60),
            payload: None,
            kind: lease_core::Kind::default(),
        })
    }

    /// Checks a schedule name: a valid run id of at most [`MAX_SCHEDULE_NAME_BYTES`] (room is
    /// kept for `@` and the tick in each run id). [`Scheduler::new`] calls it; a caller can
    /// call it before connecting to anything.
    ///
    /// # Errors
    /// The id's error, or [`InvalidInput::Schedule`] for a name too long.
    pub fn check_name(name: &str) -> Result<(), InvalidInput> {
        RunId::new(name)?;
        if name.len() > MAX_SCHEDULE_NAME_BYTES {
            return Err(InvalidInput::Schedule {
                reason: format!(
                    "schedule name of {} bytes is over the maximum of {MAX_SCHEDULE_NAME_BYTES}",
                    name.len()
                ),
            });
        }
        Ok(())
    }

    /// Each tick's run is created with `payload` ([`NewRun::with_payload`]).
    pub fn with_payload(mut self, payload: impl Into<Vec<u8>>) -> Scheduler {
        self.payload = Some(Arc::from(payload.into()));
        self
    }

    /// Each tick's run is of `kind` ([`NewRun::with_kind`]), so that a
    /// [`Worker`](crate::Worker) serves the schedule's runs with that kind's handler
    /// ([`Kinds`](crate::Kinds)).
    pub fn with_kind(mut self, kind: lease_core::Kind) -> Scheduler {
        self.kind = kind;
        self
    }

    /// A holder enqueues missed ticks at most this far back.
    pub fn with_catch_up(mut self, window: Duration) -> Scheduler {
        self.catch_up = window;
        self
    }

    /// The run id of `tick` (Unix seconds): `{name}@{tick}`.
    pub fn tick_run(&self, tick: u64) -> RunId {
        RunId::new(format!("{}@{tick}", self.name)).expect("the name leaves room for the tick")
    }

    /// The run to create for `tick`: its id, the schedule's kind and payload (shared, not
    /// copied).
    fn tick_new_run(&self, tick: u64) -> NewRun {
        NewRun::new(self.tick_run(tick))
            .with_kind(self.kind.clone())
            .with_payload_shared(self.payload.clone())
    }

    /// Takes turns at the lease and enqueues ticks while holding it, until `shutdown` (the
    /// lease is then released, so another scheduler takes over at once).
    ///
    /// # Errors
    /// [`InvalidInput::RunPayloadTooLarge`] for a payload over the bound, before any I/O; a
    /// refusal that waiting does not cure: the schedule's lease run was cancelled,
    /// completed, failed or suspended by an operator (that stops the schedule), a store error
    /// that is not retryable, or a tick's run the store refuses as bad input (a kind the
    /// backend does not offer: [`InvalidInput::Unsupported`]; the lease is released first).
    pub async fn run(self, shutdown: CancellationToken) -> Result<SchedulerReport> {
        let lease_run = RunId::new(self.name.clone())?;
        // A payload over the bound would refuse every tick: refused here, before any I/O.
        self.tick_new_run(0).check()?;
        let mut report = SchedulerReport::default();
        while !shutdown.is_cancelled() {
            let wait = match self.take(&lease_run, &shutdown).await {
                Ok(scope) => {
                    report.held += 1;
                    tracing::info!(schedule = %self.name, fence = %scope.fence(), "schedule lease taken");
                    match self.hold(&scope, &shutdown, &mut report).await {
                        Ok(true) => continue, // the lease run started afresh: take it again
                        Ok(false) => {}
                        Err(e) => {
                            // Every tick would be refused the same way: stop, and hand the
                            // lease over at once.
                            let _ = scope.release().await;
                            return Err(e);
                        }
                    }
                    if shutdown.is_cancelled() {
                        // Best effort: an unreleased lease expires by its TTL.
                        let _ = scope.release().await;
                        break;
                    }
                    tracing::warn!(schedule = %self.name, "schedule lease lost");
                    Duration::ZERO
                }
                Err(Error::Held { remaining, .. }) => remaining.min(self.ttl.as_duration()),
                Err(Error::Delayed { remaining, .. }) => remaining,
                Err(e) if e.is_retryable() => {
                    tracing::warn!(schedule = %self.name, error = %e, "schedule lease not taken; retrying");
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

    async fn take(&self, run: &RunId, shutdown: &CancellationToken) -> Result<RunScope> {
        match self.leases.create(run).await {
            Ok(_) | Err(Error::AlreadyExists { .. }) => {}
            Err(e) => return Err(e),
        }
        let config = ScopeConfig::default().with_parent(shutdown.clone());
        match RunScope::claim(
            self.leases.clone(),
            run,
            &self.worker,
            self.ttl,
            config.clone(),
        )
        .await
        {
            Err(Error::Completed { .. }) => {
                // A holder completed the lease run to start it afresh and stopped before it
                // was created again: finish that from what the completed run recorded.
                let progress = Progress::read(&*self.leases, run).await?;
                let started = progress.started.unwrap_or_else(unix_now);
                tracing::info!(schedule = %self.name, through = ?progress.through, "finishing the restart of the schedule's lease run");
                progress::restart(&*self.leases, run, started, progress.through).await?;
                RunScope::claim(self.leases.clone(), run, &self.worker, self.ttl, config).await
            }
            taken => taken,
        }
    }

    /// What the lease run records, read until it is (a store error is retried every second
    /// while the lease is held); the start written now if no holder wrote it before. `None`
    /// if the lease was lost first.
    async fn progress(&self, scope: &RunScope) -> Result<Option<Progress>> {
        loop {
            let read = match Progress::read(&*self.leases, scope.run()).await {
                Ok(mut progress) if progress.started.is_none() => {
                    let now = unix_now();
                    scope.append(now.to_string().as_bytes()).await.map(|_| {
                        progress.started = Some(now);
                        progress.entries += 1;
                        progress
                    })
                }
                read => read,
            };
            match read {
                Ok(progress) => return Ok(Some(progress)),
                Err(e) if e.is_verdict() => return Ok(None), // the lease is lost
                Err(e) if !e.is_retryable() => return Err(e),
                Err(e) => {
                    tracing::warn!(schedule = %self.name, error = %e, "schedule records not read");
                    if sleep_or_stop(scope, Duration::from_secs(1)).await {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// Enqueues ticks while `scope` holds the lease; whether it started the lease run afresh
    /// (to be taken again at once).
    async fn hold(
        &self,
        scope: &RunScope,
        shutdown: &CancellationToken,
        report: &mut SchedulerReport,
    ) -> Result<bool> {
        let catch_up = self.catch_up.as_secs();
        let Some(mut progress) = self.progress(scope).await? else {
            return Ok(false);
        };
        let started = progress.started.expect("read or written");
        if let Some(through) = progress.through {
            self.check_last_recorded(through).await;
        }
        // The last tick enqueued, or about to be: no tick at or before it is enqueued again.
        let mut done: Option<u64> = progress.through;
        loop {
            let now = unix_now();
            // Ticks after the last recorded, inside the catch-up window, never before the
            // schedule started.
            let after = now
                .saturating_sub(catch_up)
                .max(started)
                .max(done.unwrap_or(0));
            let ticks = self.schedule.ticks(after, now, MAX_BATCH);
            if !ticks.is_empty() {
                if scope.is_cancelled() {
                    return Ok(false);
                }
                let last = *ticks.last().expect("not empty");
                if done != Some(last) {
                    // Recorded before the runs are created: a holder taking over never
                    // creates them again, even after they ran and were purged.
                    match scope.append(format!("through {last}").as_bytes()).await {
                        Ok(_) => {
                            progress.entries += 1;
                            done = Some(last);
                        }
                        Err(e) if e.is_verdict() => return Ok(false), // the lease is lost
                        Err(e) => {
                            tracing::warn!(schedule = %self.name, error = %e, "ticks not recorded; trying again");
                            if sleep_or_stop(scope, Duration::from_secs(1)).await {
                                return Ok(false);
                            }
                            continue;
                        }
                    }
                }
                if !self.enqueue_all(scope, &ticks, report).await? {
                    return Ok(false);
                }
                if progress.entries >= ROTATE_AFTER && self.restart(scope, started, done).await {
                    return Ok(true);
                }
                if ticks.len() == MAX_BATCH {
                    continue; // more to catch up
                }
            }
            let last = done.unwrap_or(now);
            let Some(next) = self.schedule.next_after(last.max(now)) else {
                // The schedule has no tick left: hold until stopped.
                scope.cancelled().await;
                return Ok(false);
            };
            // To the start of the tick's second (at least a millisecond: no spinning while the
            // clock is still in the second before it).
            let wait = Duration::from_secs(next.saturating_sub(now))
                .saturating_sub(subsec())
                .max(Duration::from_millis(1));
            if shutdown.is_cancelled() || sleep_or_stop(scope, wait).await {
                return Ok(false);
            }
        }
    }

    /// Creates the runs of `ticks` (recorded already), trying again every second while the
    /// lease is held; whether they all were (created, or there already) before it was lost.
    async fn enqueue_all(
        &self,
        scope: &RunScope,
        ticks: &[u64],
        report: &mut SchedulerReport,
    ) -> Result<bool> {
        let mut from = 0;
        while from < ticks.len() {
            if let Some(last) = self.enqueue(&ticks[from..], report).await? {
                from = ticks.iter().position(|&t| t == last).expect("one of them") + 1;
            }
            if from < ticks.len() && sleep_or_stop(scope, Duration::from_secs(1)).await {
                tracing::warn!(schedule = %self.name, first = ticks[from], last = ticks[ticks.len() - 1], "lease lost with recorded ticks not created: they are not enqueued again");
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// A holder taking over looks for the last tick recorded before it: absent, it ran and was
    /// purged, or its holder stopped before creating it; either way it is not created again.
    async fn check_last_recorded(&self, tick: u64) {
        if let Err(Error::NotFound { .. }) = self.runs.inspect(&self.tick_run(tick)).await {
            tracing::info!(schedule = %self.name, tick, "the last tick recorded is not in the store (it ran and was purged, or its holder stopped before creating it): not enqueued again");
        }
    }

    /// Starts the lease run afresh (see [`progress`]): completes it, removes it, creates it
    /// again with what it recorded; whether it did (the caller takes the lease again). Not
    /// done on a store without [`purge_ids`](LeaseStore::purge_ids).
    async fn restart(&self, scope: &RunScope, started: u64, through: Option<u64>) -> bool {
        if let Err(e) = self.leases.purge_ids(&[]).await {
            tracing::debug!(schedule = %self.name, error = %e, "the leases store cannot remove runs: the lease run's journal is not started afresh");
            return false;
        }
        if let Err(e) = scope.complete().await {
            tracing::warn!(schedule = %self.name, error = %e, "the lease run was not completed to be started afresh");
            return false;
        }
        match progress::restart(&*self.leases, scope.run(), started, through).await {
            Ok(()) => {
                tracing::info!(schedule = %self.name, ?through, "the schedule's lease run started afresh")
            }
            // The next take finishes it from the completed run.
            Err(e) => {
                tracing::warn!(schedule = %self.name, error = %e, "the schedule's lease run not started afresh yet")
            }
        }
        true
    }

    /// Creates the runs of `ticks`; the last tick enqueued (created, or there already) of the
    /// unbroken prefix, or `None` if the call failed and may succeed later.
    ///
    /// # Errors
    /// The store refused the ticks' runs as bad input: no later call would take them.
    async fn enqueue(&self, ticks: &[u64], report: &mut SchedulerReport) -> Result<Option<u64>> {
        let runs: Vec<NewRun> = ticks.iter().map(|&t| self.tick_new_run(t)).collect();
        let results = match self.runs.create_many_with(&runs).await {
            Ok(results) => results,
            Err(e @ Error::InvalidInput(_)) => {
                tracing::error!(schedule = %self.name, error = %e, "the store refuses the ticks' runs; the scheduler stops");
                return Err(e);
            }
            Err(e) => {
                tracing::warn!(schedule = %self.name, error = %e, ticks = ticks.len(), "ticks not enqueued");
                return Ok(None);
            }
        };
        let mut last = None;
        for (tick, result) in ticks.iter().zip(results) {
            match result {
                Ok(()) => report.created += 1,
                Err(Error::AlreadyExists { .. }) => report.existed += 1,
                Err(e) => {
                    tracing::warn!(schedule = %self.name, tick, error = %e, "tick not enqueued");
                    return Ok(last);
                }
            }
            last = Some(*tick);
        }
        Ok(last)
    }
}

/// Sleeps `d`; whether the scope was cancelled (lease lost, or shutdown) first.
async fn sleep_or_stop(scope: &RunScope, d: Duration) -> bool {
    tokio::select! {
        () = scope.cancelled() => true,
        () = tokio::time::sleep(d) => false,
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// How far into the current second the clock is (so a sleep ends at the next second's start).
fn subsec() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(Duration::ZERO, |d| {
            Duration::from_nanos(u64::from(d.subsec_nanos()))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_tick_on_whole_multiples_of_the_epoch() {
        let every = Schedule::every(Duration::from_secs(5)).unwrap();
        assert_eq!(every.ticks(0, 20, 100), vec![5, 10, 15, 20]);
        assert_eq!(every.ticks(9, 16, 100), vec![10, 15]);
        assert_eq!(
            every.ticks(10, 14, 100),
            Vec::<u64>::new(),
            "after is exclusive"
        );
        assert_eq!(every.ticks(0, 1_000, 3), vec![5, 10, 15], "at most max");
        assert_eq!(every.next_after(u64::MAX), None, "no tick past u64");
    }

    #[test]
    fn a_bad_interval_or_name_is_refused_saying_why() {
        for bad in [
            Duration::ZERO,
            Duration::from_millis(1_500),
            MAX_INTERVAL + Duration::from_secs(1),
        ] {
            let e = Schedule::every(bad).unwrap_err();
            assert!(
                matches!(&e, InvalidInput::Schedule { reason } if reason.contains("whole number of seconds")),
                "{bad:?}: {e}"
            );
        }
        let store: Arc<dyn LeaseStore> = Arc::new(crate::MemoryLeaseStore::new());
        let every = Schedule::every(Duration::from_secs(1)).unwrap();
        let worker = WorkerId::new("w").unwrap();
        let ttl = Ttl::from_secs(5).unwrap();
        let long = "n".repeat(MAX_SCHEDULE_NAME_BYTES + 1);
        let e = Scheduler::new(
            store.clone(),
            store.clone(),
            &long,
            every.clone(),
            worker.clone(),
            ttl,
        )
        .unwrap_err();
        assert!(e.to_string().contains("schedule name of 235 bytes"), "{e}");
        assert!(Scheduler::new(store.clone(), store, "", every, worker, ttl).is_err());
    }

    #[cfg(feature = "cron")]
    #[test]
    fn cron_expressions_tick_in_utc_with_seconds_optional() {
        // 2026-12-02T00:00:00Z
        let midnight = 1_796_169_600;
        let hourly = Schedule::cron("0 * * * *").unwrap();
        assert_eq!(
            hourly.ticks(midnight, midnight + 3 * 3600, 10),
            vec![midnight + 3600, midnight + 7200, midnight + 10_800]
        );
        let every_ten_seconds = Schedule::cron("*/10 * * * * *").unwrap();
        assert_eq!(
            every_ten_seconds.ticks(midnight, midnight + 30, 10),
            vec![midnight + 10, midnight + 20, midnight + 30]
        );
        let e = Schedule::cron("61 * * * *").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("bad schedule: cron expression \"61 * * * *\""),
            "{e}"
        );
    }
}
