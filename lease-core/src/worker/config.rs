//! [`WorkerConfig`]: how a [`Worker`](crate::Worker)(super::Worker) runs.

use std::time::Duration;

use crate::error::InvalidInput;
use crate::scope::ScopeConfig;
use crate::types::{Ttl, MAX_BATCH};

/// How a [`Worker`](crate::Worker) runs: lease TTL, how many handlers at once, how it polls when idle, how it
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
    pub(super) ttl: Ttl,
    pub(super) concurrency: usize,
    pub(super) poll_interval: Duration,
    pub(super) batch_size: usize,
    pub(super) batch_delay: Duration,
    pub(super) grace: Duration,
    pub(super) heartbeat: Option<Duration>,
    pub(super) margin: Option<Duration>,
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

    /// Flush the ends of leases to the store in one [`end_many`](crate::LeaseStore::end_many) when
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

    pub(super) fn heartbeat(&self) -> Duration {
        self.heartbeat.unwrap_or(self.ttl.as_duration() / 3)
    }

    pub(super) fn check(&self) -> Result<(), InvalidInput> {
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
