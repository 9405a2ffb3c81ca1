//! [`KindPolicy`]: a kind's own concurrency, retry policy and attempt timeout in a worker.

use std::time::Duration;

use super::RetryPolicy;

/// What one kind of a [`Worker`](crate::Worker) runs under, each field falling back to the
/// worker's: its own concurrency limit (within the worker's), its [`RetryPolicy`] (backoff and
/// attempt budget) and its attempt timeout. Given with
/// [`Kinds::handle_with`](crate::Kinds::handle_with), or by a typed job's
/// [`JobArgs::policy`](crate::JobArgs::policy). Checked when the worker starts, by the rules of
/// the worker's own settings.
///
/// ```
/// use std::time::Duration;
/// use lease_runtime::{KindPolicy, RetryPolicy};
/// // Charges: three attempts a minute apart, each cut off after 20 s, four at a time.
/// let charges = KindPolicy::new()
///     .with_concurrency(4)
///     .with_retry(
///         RetryPolicy::default()
///             .with_max_attempts(3)
///             .with_backoff(Duration::from_secs(60), Duration::from_secs(60)),
///     )
///     .with_attempt_timeout(Duration::from_secs(20));
/// # let _ = charges;
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[must_use]
pub struct KindPolicy {
    pub(super) concurrency: Option<usize>,
    pub(super) retry: Option<RetryPolicy>,
    pub(super) attempt_timeout: Option<Duration>,
}

impl KindPolicy {
    /// The worker's settings for everything.
    pub fn new() -> KindPolicy {
        KindPolicy::default()
    }

    /// At most `n` of the kind's runs at once (1 up to the worker's concurrency).
    pub fn with_concurrency(mut self, n: usize) -> KindPolicy {
        self.concurrency = Some(n);
        self
    }

    /// The kind's retry policy instead of the worker's
    /// ([`WorkerConfig::with_retry`](crate::WorkerConfig::with_retry)).
    pub fn with_retry(mut self, retry: RetryPolicy) -> KindPolicy {
        self.retry = Some(retry);
        self
    }

    /// The kind's attempt deadline instead of the worker's
    /// ([`WorkerConfig::with_attempt_timeout`](crate::WorkerConfig::with_attempt_timeout)): 1 ms
    /// to 30 days.
    pub fn with_attempt_timeout(mut self, d: Duration) -> KindPolicy {
        self.attempt_timeout = Some(d);
        self
    }

    /// `self`, each unset field taken from `defaults`.
    pub fn or(self, defaults: KindPolicy) -> KindPolicy {
        KindPolicy {
            concurrency: self.concurrency.or(defaults.concurrency),
            retry: self.retry.or(defaults.retry),
            attempt_timeout: self.attempt_timeout.or(defaults.attempt_timeout),
        }
    }
}
