//! [`WorkerConfig`]: how a [`Worker`](crate::Worker)(super::Worker) runs.

use std::time::Duration;

use lease_core::{InvalidInput, Ttl, MAX_BATCH};

use crate::scope::ScopeConfig;

/// How often a worker woken by its store's wake-ups polls anyway: 2 s.
pub const DEFAULT_WAKE_POLL: Duration = Duration::from_secs(2);

/// The longest shutdown grace a worker takes: a day.
const MAX_GRACE: Duration = Duration::from_secs(86_400);

/// How a [`Worker`](crate::Worker) runs: lease TTL, how many handlers at once, how it polls when idle, how it
/// batches the ends of leases, and how long a shutdown waits for handlers.
///
/// ```
/// # fn main() -> Result<(), lease_core::InvalidInput> {
/// use std::time::Duration;
/// use lease_core::Ttl;
/// use lease_runtime::WorkerConfig;
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
    pub(super) ttl: Ttl,
    pub(super) concurrency: usize,
    pub(super) poll_interval: Duration,
    /// The fallback poll of a worker whose store sends wake-ups; `None`: wake-ups off.
    pub(super) wake_poll: Option<Duration>,
    pub(super) batch_size: usize,
    pub(super) batch_delay: Duration,
    pub(super) grace: Duration,
    pub(super) heartbeat: Option<Duration>,
    pub(super) margin: Option<Duration>,
    pub(super) retry: RetryPolicy,
    pub(super) attempt_timeout: Option<Duration>,
    pub(super) retention: Option<lease_core::Retention>,
    pub(super) retention_every: Duration,
    /// The queues served, each with its own concurrency (`None`: the worker's); empty: the
    /// default queue alone.
    pub(super) queues: Vec<(lease_core::Queue, Option<usize>)>,
}

/// What a [`Worker`](crate::Worker) does with a run whose attempt failed (its handler returned
/// an error, panicked, outlived its attempt deadline, or returned after its lease's local
/// deadline cancelled it): give it back with a delay that grows with the attempt number, on the
/// store's clock ([`End::AttemptFailed`](lease_core::End::AttemptFailed)), and give up on it
/// ([`End::Fail`](lease_core::End::Fail), with the error as the reason) at attempt `max_attempts`.
///
/// The attempt number is the lease's [`attempt`](lease_core::Lease::attempt): claims since the run
/// was created or resumed, less those that ended voluntarily (a release, a suspend, a snooze,
/// a shutdown hand-back). A claim whose holder crashed or hung counts, so the budget is also
/// checked **at claim time**: a run claimed past `max_attempts` is failed without running its
/// handler.
///
/// The delay after attempt `n` is `base × 2^(n−1)`, capped at `max`, of which a random part up
/// to half is taken off (jitter), so failing runs of one cause do not come back in step.
///
/// ```
/// use std::time::Duration;
/// use lease_runtime::RetryPolicy;
/// let policy = RetryPolicy::default()
///     .with_backoff(Duration::from_millis(50), Duration::from_secs(60))
///     .with_max_attempts(5);
/// assert_eq!(policy.max_attempts(), Some(5));
/// let third = policy.delay(3);
/// assert!(third <= Duration::from_millis(200) && third >= Duration::from_millis(100));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    base: Duration,
    max: Duration,
    max_attempts: Option<u64>,
}

impl Default for RetryPolicy {
    /// Backoff from 1 s, capped at 10 minutes; failed after 25 attempts.
    fn default() -> Self {
        RetryPolicy {
            base: Duration::from_secs(1),
            max: Duration::from_secs(600),
            max_attempts: Some(25),
        }
    }
}

impl RetryPolicy {
    /// Delays of `base × 2^(n−1)` after attempt `n`, at most `max` (at most
    /// [`MAX_RETRY_DELAY`](lease_core::MAX_RETRY_DELAY)). A zero `base` gives runs back at once.
    pub fn with_backoff(mut self, base: Duration, max: Duration) -> RetryPolicy {
        self.base = base;
        self.max = max;
        self
    }

    /// Give up on a run (failed) when attempt `n` fails (1 or more), and fail without running
    /// it a run claimed past attempt `n`.
    pub fn with_max_attempts(mut self, n: u64) -> RetryPolicy {
        self.max_attempts = Some(n);
        self
    }

    /// Never give up: retry with backoff for ever.
    pub fn without_max_attempts(mut self) -> RetryPolicy {
        self.max_attempts = None;
        self
    }

    /// The attempt whose failure fails the run, if any.
    pub fn max_attempts(&self) -> Option<u64> {
        self.max_attempts
    }

    /// Whether a failure of attempt `attempt` fails the run.
    pub fn gives_up(&self, attempt: u64) -> bool {
        self.max_attempts.is_some_and(|max| attempt >= max)
    }

    /// The delay after a failure of attempt `attempt` (from 1), jitter included: between half
    /// and all of `min(max, base × 2^(attempt−1))`, in whole milliseconds.
    pub fn delay(&self, attempt: u64) -> Duration {
        use std::hash::{BuildHasher, Hasher};
        let exponent = attempt.saturating_sub(1).min(63) as u32;
        let full = self
            .base
            .checked_mul(2u32.saturating_pow(exponent.min(31)))
            .unwrap_or(self.max)
            .min(self.max);
        let full_ms = full.as_millis() as u64;
        if full_ms < 2 {
            return Duration::from_millis(full_ms);
        }
        // Randomness without a dependency: the std hasher's per-process random keys.
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(attempt);
        let off = hasher.finish() % (full_ms / 2 + 1);
        Duration::from_millis(full_ms - off)
    }
}

impl WorkerConfig {
    /// Leases of `ttl`; defaults: 10 handlers at once, woken by the store's wake-ups with a
    /// fallback poll every [`DEFAULT_WAKE_POLL`] (idle polls backing off up to every 100 ms on
    /// a store without wake-ups), ends flushed at 100 or 1 ms after the first one waits, 10 s of grace at
    /// shutdown, the hub renewing every TTL/3 with a margin of TTL/10, failed handlers
    /// retried with [`RetryPolicy::default`].
    pub fn new(ttl: Ttl) -> WorkerConfig {
        WorkerConfig {
            ttl,
            concurrency: 10,
            poll_interval: Duration::from_millis(100),
            wake_poll: Some(DEFAULT_WAKE_POLL),
            batch_size: 100,
            batch_delay: Duration::from_millis(1),
            grace: Duration::from_secs(10),
            heartbeat: None,
            margin: None,
            retry: RetryPolicy::default(),
            attempt_timeout: None,
            retention: Some(lease_core::Retention::default()),
            retention_every: crate::retention::DEFAULT_PURGE_EVERY,
            queues: Vec::new(),
        }
    }

    /// Serves `queue` too, with at most `concurrency` of its jobs at once (within the worker's
    /// own [concurrency](WorkerConfig::with_concurrency); `None`: no limit of its own). A
    /// worker given no queue serves the [`DEFAULT_QUEUE`](lease_core::DEFAULT_QUEUE) alone; a
    /// worker given queues serves those only (name `default` to keep it). Each queue is
    /// claimed from on its own ([`claim_next_in`](lease_core::LeaseStore::claim_next_in)),
    /// taken in turn with the kinds, and a paused queue is passed by
    /// ([`pause_queue`](lease_core::LeaseStore::pause_queue)). Checked when the worker is made:
    /// a queue twice, or a limit of 0 or above the worker's concurrency, is refused.
    ///
    /// ```
    /// use lease_core::{Queue, Ttl};
    /// use lease_runtime::WorkerConfig;
    /// let config = WorkerConfig::new(Ttl::from_secs(30)?)
    ///     .with_concurrency(20)
    ///     .with_queue(Queue::new("mailers")?, Some(4))
    ///     .with_queue(Queue::default(), None);
    /// assert!(config.check().is_ok());
    /// # Ok::<(), lease_core::InvalidInput>(())
    /// ```
    pub fn with_queue(
        mut self,
        queue: lease_core::Queue,
        concurrency: Option<usize>,
    ) -> WorkerConfig {
        self.queues.push((queue, concurrency));
        self
    }

    /// The queues served, each with its own limit: the default queue alone unless
    /// [`with_queue`](WorkerConfig::with_queue) named others.
    pub fn queues(&self) -> Vec<(lease_core::Queue, Option<usize>)> {
        if self.queues.is_empty() {
            vec![(lease_core::Queue::default(), None)]
        } else {
            self.queues.clone()
        }
    }

    /// Retention by the fleet, one age for every ended state:
    /// [`with_retention_policy`](WorkerConfig::with_retention_policy) of
    /// [`Retention::all`](lease_core::Retention::all)`(age)`. `age` must be at most
    /// [`MAX_PURGE_AGE`](lease_core::MAX_PURGE_AGE).
    pub fn with_retention(mut self, age: Duration) -> WorkerConfig {
        self.retention = Some(lease_core::Retention::all(age));
        self
    }

    /// Retention by the fleet: while it runs, the worker takes turns with the other workers of
    /// the store at a [`Purger`](crate::Purger), which removes ended runs that ended longer
    /// ago than `retention` keeps their state (on the store's clock), in batches of
    /// [`DEFAULT_PURGE_BATCH`](crate::DEFAULT_PURGE_BATCH), every
    /// [period](WorkerConfig::with_retention_every). One worker of the fleet purges at a time:
    /// they hold the purge lease in turn, as the run [`DEFAULT_PURGER_NAME`](crate::DEFAULT_PURGER_NAME) of kind
    /// [`PURGER_KIND`](crate::PURGER_KIND) in the store itself (serve no runs of that kind;
    /// `list` and `count` show that run, held while a purger runs).
    ///
    /// On by default, as River's is: [`Retention::default`](lease_core::Retention::default) purges
    /// completed runs 24 hours after they ended, failed and cancelled ones after 7 days.
    /// `None` keeps every run (the store grows by every run until something else purges it).
    /// Keep ended runs as long as anyone reads their journals. Ignored on the `memory:` store
    /// (one process, no fleet).
    ///
    /// ```
    /// use std::time::Duration;
    /// use lease_core::{Retention, Ttl};
    /// use lease_runtime::WorkerConfig;
    /// let ttl = Ttl::from_secs(30)?;
    /// let keep_failures = Retention::default().with_failed(None)?;
    /// let config = WorkerConfig::new(ttl).with_retention_policy(keep_failures);
    /// let keep_all = WorkerConfig::new(ttl).with_retention_policy(None);
    /// # let _ = (config, keep_all);
    /// # Ok::<(), lease_core::InvalidInput>(())
    /// ```
    pub fn with_retention_policy(
        mut self,
        retention: impl Into<Option<lease_core::Retention>>,
    ) -> WorkerConfig {
        self.retention = retention.into();
        self
    }

    /// How often the purging worker looks for ended runs to remove (1 s to a day; default
    /// [`DEFAULT_PURGE_EVERY`](crate::DEFAULT_PURGE_EVERY), a minute). Only with
    /// [retention](WorkerConfig::with_retention).
    pub fn with_retention_every(mut self, every: Duration) -> WorkerConfig {
        self.retention_every = every;
        self
    }

    /// Each attempt's deadline, apart from the lease's heartbeat: a handler still running `d`
    /// after it started has its token cancelled, gets the [grace](WorkerConfig::with_grace) to
    /// return, and is then aborted and no longer waited for (one that ignores its token too,
    /// and one that blocks its thread: see [`Worker`](crate::Worker)'s *Handlers that block
    /// their thread*). The attempt counts as failed: the run is retried with the policy's
    /// backoff, or failed at its last attempt, while the worker goes on serving other runs.
    /// Off by default; `d` must be 1 ms to 30 days.
    pub fn with_attempt_timeout(mut self, d: Duration) -> WorkerConfig {
        self.attempt_timeout = Some(d);
        self
    }

    /// What happens to a run whose handler failed (see [`RetryPolicy`]; the default backs off
    /// from 1 s to 10 minutes and fails the run at its 25th attempt).
    pub fn with_retry(mut self, policy: RetryPolicy) -> WorkerConfig {
        self.retry = policy;
        self
    }

    /// At most `n` handlers run at once (1 to 10,000); `claim_next` asks for the free slots.
    pub fn with_concurrency(mut self, n: usize) -> WorkerConfig {
        self.concurrency = n;
        self
    }

    /// On a store without wake-ups (or with them turned off): when `claim_next` finds
    /// nothing, poll again after 1 ms, doubling up to `interval`. A run released by another
    /// worker is therefore claimed within one `interval`.
    pub fn with_poll_interval(mut self, interval: Duration) -> WorkerConfig {
        self.poll_interval = interval;
        self
    }

    /// On a store that sends wake-ups ([`LeaseStore::wakes`](lease_core::LeaseStore::wakes)), an
    /// idle worker claims when woken for a kind it serves, and otherwise polls every
    /// `interval` (default [`DEFAULT_WAKE_POLL`]; above zero, at most an hour): a lost
    /// wake-up, an expired lease, or a delay the store could not announce is found within
    /// one `interval`.
    pub fn with_wake_poll_interval(mut self, interval: Duration) -> WorkerConfig {
        self.wake_poll = Some(interval);
        self
    }

    /// Ignore the store's wake-ups and poll (backing off up to the
    /// [poll interval](WorkerConfig::with_poll_interval)), as on a store without them.
    pub fn without_wake_ups(mut self) -> WorkerConfig {
        self.wake_poll = None;
        self
    }

    /// Flush the ends of leases to the store in one [`end_many`](lease_core::LeaseStore::end_many) when
    /// `size` (1 to [`MAX_BATCH`]) are waiting, or `delay` after the first one started waiting,
    /// whichever comes first. A zero delay flushes whatever is waiting at once.
    pub fn with_batch(mut self, size: usize, delay: Duration) -> WorkerConfig {
        self.batch_size = size;
        self.batch_delay = delay;
        self
    }

    /// At shutdown, wait up to `grace` (at most a day, checked by
    /// [`Worker::new`](crate::Worker::new)) for running handlers before cancelling them and
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

    pub(super) fn heartbeat(&self) -> Duration {
        self.heartbeat.unwrap_or(self.ttl.as_duration() / 3)
    }

    /// What [`Worker::new`](crate::Worker::new) checks, for a caller that validates its
    /// settings before it connects to the store: every setting in range, and the scope timing
    /// the heartbeat and margin make.
    ///
    /// # Errors
    /// [`InvalidInput::WorkerSetting`] or [`InvalidInput::ScopeTiming`].
    pub fn check(&self) -> Result<(), InvalidInput> {
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
        for (at, (queue, limit)) in self.queues.iter().enumerate() {
            if self.queues[..at].iter().any(|(q, _)| q == queue) {
                return bad("queues", queue.to_string(), "a queue is given once");
            }
            if let Some(limit) = limit {
                if !(1..=self.concurrency).contains(limit) {
                    return bad(
                        "queue concurrency",
                        format!("{limit} for queue {queue}"),
                        "it must be 1 to the worker's concurrency",
                    );
                }
            }
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
        if let Some(wake_poll) = self.wake_poll {
            if wake_poll.is_zero() || wake_poll > Duration::from_secs(3600) {
                return bad(
                    "wake poll interval",
                    format!("{wake_poll:?}"),
                    "it must be above zero and at most an hour",
                );
            }
        }
        if self.batch_delay >= self.ttl.as_duration() / 2 {
            return bad(
                "batch delay",
                format!("{:?}", self.batch_delay),
                "it must be shorter than half the TTL",
            );
        }
        check_retry(&self.retry, "")?;
        if let Some(d) = self.attempt_timeout {
            check_attempt_timeout(d, "")?;
        }
        if self.grace > MAX_GRACE {
            return bad(
                "grace",
                format!("{:?}", self.grace),
                "it must be at most a day (the shutdown waits that long for running handlers)",
            );
        }
        if let Some(retention) = self.retention {
            if retention.check().is_err() {
                return bad(
                    "retention",
                    format!("{retention:?}"),
                    "each age must be at most MAX_PURGE_AGE (100 years)",
                );
            }
        }
        if self.retention_every < Duration::from_secs(1)
            || self.retention_every > Duration::from_secs(86_400)
        {
            return bad(
                "retention every",
                format!("{:?}", self.retention_every),
                "it must be 1 s to a day",
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

/// Checks a retry policy's backoff (a worker's, or a kind's: `whose` then names it).
pub(super) fn check_retry(retry: &RetryPolicy, whose: &str) -> Result<(), InvalidInput> {
    if retry.max > lease_core::MAX_RETRY_DELAY || retry.base > retry.max {
        return Err(InvalidInput::WorkerSetting {
            setting: "retry backoff",
            value: format!("{:?} to {:?}{whose}", retry.base, retry.max),
            rule: "the base must be at most the cap, and the cap at most MAX_RETRY_DELAY (30 days)",
        });
    }
    if retry.max_attempts == Some(0) {
        return Err(InvalidInput::WorkerSetting {
            setting: "max attempts",
            value: format!("0{whose}"),
            rule: "it must be at least 1",
        });
    }
    Ok(())
}

/// Checks an attempt timeout (a worker's, or a kind's: `whose` then names it).
pub(super) fn check_attempt_timeout(d: Duration, whose: &str) -> Result<(), InvalidInput> {
    if d.is_zero() || d > lease_core::MAX_RETRY_DELAY {
        return Err(InvalidInput::WorkerSetting {
            setting: "attempt timeout",
            value: format!("{d:?}{whose}"),
            rule: "it must be above zero and at most 30 days",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A grace no clock can add (`Duration::MAX` used to panic at shutdown) is refused when
    /// the worker is built, naming the setting; a day is the most taken.
    #[test]
    fn a_grace_past_a_day_is_refused_by_name() {
        let ttl = Ttl::from_secs(30).unwrap();
        for grace in [Duration::MAX, MAX_GRACE + Duration::from_millis(1)] {
            match WorkerConfig::new(ttl).with_grace(grace).check() {
                Err(InvalidInput::WorkerSetting { setting, .. }) => assert_eq!(setting, "grace"),
                other => panic!("{grace:?}: {other:?}"),
            }
        }
        assert!(WorkerConfig::new(ttl).with_grace(MAX_GRACE).check().is_ok());
        assert!(WorkerConfig::new(ttl)
            .with_grace(Duration::ZERO)
            .check()
            .is_ok());
    }
}
