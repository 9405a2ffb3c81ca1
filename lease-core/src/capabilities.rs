//! What a store supports and how finely it times: [`Capabilities`].

use std::time::Duration;

/// The longest `min_ttl`, granularity or expiry lag a store may declare.
pub const MAX_TIMED: Duration = Duration::from_secs(10);

/// What a store supports and how finely it times, as [`LeaseStore::capabilities`] tells it:
/// for callers that adapt to the store (a dashboard that shows the queue's lag only where the
/// store reports it), and for the conformance suite, which runs each scenario at the store's
/// pace and skips only what the store says it lacks.
///
/// The [`Default`] is the whole contract timed to the millisecond (memory, Postgres, Redis);
/// a backend declares what it lacks with the `without_*` builders, and its coarser timing
/// with the `with_*` ones.
///
/// ```
/// use std::time::Duration;
/// use lease_core::Capabilities;
///
/// // etcd: leases are whole seconds, and the server refuses or raises TTLs below its minimum.
/// let etcd = Capabilities::default()
///     .with_min_ttl(Duration::from_secs(1))
///     .with_ttl_granularity(Duration::from_secs(1))
///     .without_kind_counts();
/// assert!(!etcd.kind_counts && etcd.wake_ups);
/// ```
///
/// [`LeaseStore::capabilities`]: crate::LeaseStore::capabilities
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// The shortest TTL the store times as asked (and so the shortest a scenario asks for).
    pub min_ttl: Duration,
    /// The store times TTLs in whole multiples of this; scenarios only ask for such TTLs.
    pub ttl_granularity: Duration,
    /// How long after a lease's TTL has run out (counted from the instant the store received
    /// the claim or renewal) the store may still judge it live. Never early, but a store
    /// whose expiry is found by a periodic sweep (etcd's leader checks its leases every
    /// 500 ms) may be this late. Scenarios wait this much longer before they expect expiry,
    /// and the model check accepts either answer for this much longer.
    pub max_expiry_lag: Duration,
    /// Whether [`count`](crate::LeaseStore::count) reports the queue's lag
    /// ([`RunCounts::oldest_claimable_age`](crate::RunCounts::oldest_claimable_age)); a
    /// store that times no instants of its own (etcd) reports `None`.
    pub queue_lag: bool,
    /// Whether records carry the run's times ([`RunRecord::created_at`] and the others).
    ///
    /// [`RunRecord::created_at`]: crate::RunRecord::created_at
    pub record_times: bool,
    /// Whether [`inspect`](crate::LeaseStore::inspect) reports the run's attempt history
    /// ([`RunRecord::history`]).
    ///
    /// [`RunRecord::history`]: crate::RunRecord::history
    pub attempt_history: bool,
    /// Whether [`count_kinds`](crate::LeaseStore::count_kinds) counts by kind (etcd
    /// refuses it as unsupported).
    pub kind_counts: bool,
    /// Whether the store sends wake-ups ([`LeaseStore::wakes`](crate::LeaseStore::wakes)).
    pub wake_ups: bool,
    /// Whether runs can be created for a wall-clock time
    /// ([`NewRun::with_run_at`](crate::NewRun::with_run_at)).
    pub run_at: bool,
    /// Whether runs can be created in queues other than the default
    /// ([`NewRun::with_queue`](crate::NewRun::with_queue)) and queues paused
    /// ([`LeaseStore::pause_queue`](crate::LeaseStore::pause_queue)).
    pub queues: bool,
    /// Whether a lease can end waiting for a signal
    /// ([`End::AwaitSignal`](crate::End::AwaitSignal)) and a signal be delivered
    /// ([`LeaseStore::deliver_signal`](crate::LeaseStore::deliver_signal)). A store without
    /// refuses both with [`InvalidInput::Unsupported`](crate::InvalidInput::Unsupported).
    pub signals: bool,
    /// Whether runs can be created, and leases ended, inside the caller's own database
    /// transaction (Postgres: `PostgresLeaseStore::create_in`, `end_in`). Not part of the
    /// trait: a backend's own API, `false` by default.
    pub transactional_enqueue: bool,
}

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities {
            min_ttl: Duration::from_millis(1),
            ttl_granularity: Duration::from_millis(1),
            max_expiry_lag: Duration::ZERO,
            queue_lag: true,
            record_times: true,
            attempt_history: true,
            kind_counts: true,
            wake_ups: true,
            run_at: true,
            queues: true,
            signals: true,
            transactional_enqueue: false,
        }
    }
}

impl Capabilities {
    /// The shortest TTL the store times as asked.
    ///
    /// # Panics
    /// When `min_ttl` is zero, over [`MAX_TIMED`], or not a whole number of milliseconds.
    #[must_use]
    pub fn with_min_ttl(mut self, min_ttl: Duration) -> Self {
        assert!(
            !min_ttl.is_zero() && min_ttl <= MAX_TIMED && whole_millis(min_ttl),
            "min_ttl must be whole milliseconds in 1 ms..={MAX_TIMED:?}, got {min_ttl:?}"
        );
        self.min_ttl = min_ttl;
        self
    }

    /// The step the store times TTLs in.
    ///
    /// # Panics
    /// When `granularity` is zero, over [`MAX_TIMED`], or not a whole number of milliseconds.
    #[must_use]
    pub fn with_ttl_granularity(mut self, granularity: Duration) -> Self {
        assert!(
            !granularity.is_zero() && granularity <= MAX_TIMED && whole_millis(granularity),
            "ttl_granularity must be whole milliseconds in 1 ms..={MAX_TIMED:?}, \
             got {granularity:?}"
        );
        self.ttl_granularity = granularity;
        self
    }

    /// How late the store may judge a lease expired.
    ///
    /// # Panics
    /// When `lag` is over [`MAX_TIMED`] or not a whole number of milliseconds.
    #[must_use]
    pub fn with_max_expiry_lag(mut self, lag: Duration) -> Self {
        assert!(
            lag <= MAX_TIMED && whole_millis(lag),
            "max_expiry_lag must be whole milliseconds up to {MAX_TIMED:?}, got {lag:?}"
        );
        self.max_expiry_lag = lag;
        self
    }

    /// The store does not report the queue's lag.
    #[must_use]
    pub fn without_queue_lag(mut self) -> Self {
        self.queue_lag = false;
        self
    }

    /// The store's records carry no times.
    #[must_use]
    pub fn without_record_times(mut self) -> Self {
        self.record_times = false;
        self
    }

    /// The store keeps no attempt history.
    #[must_use]
    pub fn without_attempt_history(mut self) -> Self {
        self.attempt_history = false;
        self
    }

    /// The store does not count by kind.
    #[must_use]
    pub fn without_kind_counts(mut self) -> Self {
        self.kind_counts = false;
        self
    }

    /// The store sends no wake-ups: its workers poll.
    #[must_use]
    pub fn without_wake_ups(mut self) -> Self {
        self.wake_ups = false;
        self
    }

    /// The store refuses runs created for a wall-clock time.
    #[must_use]
    pub fn without_run_at(mut self) -> Self {
        self.run_at = false;
        self
    }

    /// The store keeps no queues but the default, and pauses none.
    #[must_use]
    pub fn without_queues(mut self) -> Self {
        self.queues = false;
        self
    }

    /// The store has no signals: it refuses [`End::AwaitSignal`](crate::End::AwaitSignal)
    /// and [`deliver_signal`](crate::LeaseStore::deliver_signal).
    #[must_use]
    pub fn without_signals(mut self) -> Self {
        self.signals = false;
        self
    }

    /// The store creates runs inside the caller's transaction.
    #[must_use]
    pub fn with_transactional_enqueue(mut self) -> Self {
        self.transactional_enqueue = true;
        self
    }
}

pub(crate) fn whole_millis(d: Duration) -> bool {
    d.subsec_nanos() % 1_000_000 == 0
}
