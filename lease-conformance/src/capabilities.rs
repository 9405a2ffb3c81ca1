//! What a backend can time, declared by its [`StoreFactory`](crate::StoreFactory), and the
//! scenario timings derived from it.
//!
//! The scenarios were written for stores that time a lease to the millisecond (memory,
//! Postgres, Redis): a "short" lease of 150 ms, waited out for 400 ms. A store whose leases
//! tick in whole seconds with a floor of a second or two (etcd) cannot time that, and must
//! never expire a lease early to pretend it can. Such a backend declares its limits in
//! [`Capabilities`]; every scenario reads them through [`Timing`] and stretches its TTLs and
//! the waits that go with them, so the same rules are checked at the store's own pace.

use std::time::Duration;

use lease_core::Ttl;

/// The short TTL the scenarios were written around; every scaled duration keeps its ratio to it.
const BASE_SHORT: Duration = Duration::from_millis(150);

/// How long past the short TTL the scenarios wait before they expect it expired, at scale 1.
const BASE_EXPIRY_SLACK: Duration = Duration::from_millis(250);

/// The largest `min_ttl` the suite accepts: scenarios use 60 s TTLs as "longer than the
/// scenario", and stretched TTLs must stay far below [`Ttl::MAX`].
pub const MAX_MIN_TTL: Duration = Duration::from_secs(10);

/// What a backend can time, as the conformance suite needs to know it.
///
/// The [`Default`] describes a store that times any TTL to the millisecond: with it every
/// scenario runs with exactly the timings it was written with.
///
/// ```
/// use std::time::Duration;
/// use lease_conformance::Capabilities;
///
/// // etcd: leases are whole seconds, and the server refuses or raises TTLs below its minimum.
/// let etcd = Capabilities::default()
///     .with_min_ttl(Duration::from_secs(1))
///     .with_ttl_granularity(Duration::from_secs(1));
/// assert_eq!(etcd.timing().short_ttl().as_duration(), Duration::from_secs(1));
/// ```
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
    /// Whether [`count`](lease_core::LeaseStore::count) reports the queue's lag
    /// ([`RunCounts::oldest_claimable_age`](lease_core::RunCounts::oldest_claimable_age)); a
    /// store that times no instants of its own (etcd) reports `None`.
    pub queue_lag: bool,
    /// Whether records carry the run's times ([`RunRecord::created_at`] and the others).
    ///
    /// [`RunRecord::created_at`]: lease_core::RunRecord::created_at
    pub record_times: bool,
    /// Whether [`inspect`](lease_core::LeaseStore::inspect) reports the run's attempt history
    /// ([`RunRecord::history`]).
    ///
    /// [`RunRecord::history`]: lease_core::RunRecord::history
    pub attempt_history: bool,
    /// Whether [`count_kinds`](lease_core::LeaseStore::count_kinds) counts by kind (etcd
    /// refuses it as unsupported).
    pub kind_counts: bool,
    /// Whether the store sends wake-ups ([`LeaseStore::wakes`](lease_core::LeaseStore::wakes)).
    pub wake_ups: bool,
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
        }
    }
}

impl Capabilities {
    /// The shortest TTL the store times as asked.
    ///
    /// # Panics
    /// When `min_ttl` is zero, over [`MAX_MIN_TTL`], or not a whole number of milliseconds.
    #[must_use]
    pub fn with_min_ttl(mut self, min_ttl: Duration) -> Self {
        assert!(
            !min_ttl.is_zero() && min_ttl <= MAX_MIN_TTL && whole_millis(min_ttl),
            "min_ttl must be whole milliseconds in 1 ms..={MAX_MIN_TTL:?}, got {min_ttl:?}"
        );
        self.min_ttl = min_ttl;
        self
    }

    /// The step the store times TTLs in.
    ///
    /// # Panics
    /// When `granularity` is zero, over [`MAX_MIN_TTL`], or not a whole number of milliseconds.
    #[must_use]
    pub fn with_ttl_granularity(mut self, granularity: Duration) -> Self {
        assert!(
            !granularity.is_zero() && granularity <= MAX_MIN_TTL && whole_millis(granularity),
            "ttl_granularity must be whole milliseconds in 1 ms..={MAX_MIN_TTL:?}, \
             got {granularity:?}"
        );
        self.ttl_granularity = granularity;
        self
    }

    /// How late the store may judge a lease expired.
    ///
    /// # Panics
    /// When `lag` is over [`MAX_MIN_TTL`] or not a whole number of milliseconds.
    #[must_use]
    pub fn with_max_expiry_lag(mut self, lag: Duration) -> Self {
        assert!(
            lag <= MAX_MIN_TTL && whole_millis(lag),
            "max_expiry_lag must be whole milliseconds up to {MAX_MIN_TTL:?}, got {lag:?}"
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

    /// The scenario timings for a store with these capabilities.
    pub fn timing(&self) -> Timing {
        Timing::new(*self)
    }
}

fn whole_millis(d: Duration) -> bool {
    d.subsec_nanos() % 1_000_000 == 0
}

/// Scenario timings derived from [`Capabilities`].
///
/// The short TTL is the smallest one the store times that is at least the 150 ms the scenarios
/// were written with. Everything that must keep its proportion to a TTL (a wait past expiry,
/// a heartbeat interval, a safety margin, a reply delay) is stretched by the same ratio,
/// `short / 150 ms`, through [`Timing::scale`] and [`Timing::ttl`]; a TTL that only has to be
/// "long enough" is merely raised to what the store can time, through [`Timing::at_least`].
/// With the default capabilities the ratio is exactly 1 and every value is the original one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    caps: Capabilities,
    short: Duration,
}

impl Timing {
    /// The timings for `caps`.
    pub fn new(caps: Capabilities) -> Self {
        let short = round_up(BASE_SHORT.max(caps.min_ttl), caps.ttl_granularity);
        Timing { caps, short }
    }

    /// The capabilities these timings come from.
    pub fn capabilities(&self) -> Capabilities {
        self.caps
    }

    /// Whether the store needs longer timings than the scenarios were written with.
    pub fn is_stretched(&self) -> bool {
        self.short != BASE_SHORT
    }

    /// `base` (a duration at scale 1) stretched by `short / 150 ms`, to the millisecond.
    pub fn scale(&self, base: Duration) -> Duration {
        if !self.is_stretched() {
            return base;
        }
        let nanos = base.as_nanos() * self.short.as_nanos() / BASE_SHORT.as_nanos();
        let millis = nanos.div_ceil(1_000_000);
        Duration::from_millis(u64::try_from(millis).expect("a scaled duration fits u64 ms"))
    }

    /// A TTL of `base_ms` at scale 1, stretched like [`Timing::scale`], then raised to the
    /// store's minimum and rounded up to its granularity. For TTLs whose proportion to the
    /// scenario's waits, heartbeats or margins matters.
    pub fn ttl(&self, base_ms: u64) -> Ttl {
        self.timeable(self.scale(Duration::from_millis(base_ms)))
    }

    /// A TTL of at least `ms`, raised to the store's minimum and rounded up to its
    /// granularity, but not stretched. For TTLs that only need to be long enough.
    pub fn at_least(&self, ms: u64) -> Ttl {
        self.timeable(Duration::from_millis(ms))
    }

    /// The short TTL: one a scenario waits out (150 ms at scale 1).
    pub fn short_ttl(&self) -> Ttl {
        self.timeable(self.short)
    }

    /// How long to wait after a claim under [`Timing::short_ttl`] until it has surely expired
    /// on the store (400 ms at scale 1): the TTL, plus slack stretched like the TTL, plus the
    /// store's [`max_expiry_lag`](Capabilities::max_expiry_lag).
    pub fn past_short(&self) -> Duration {
        self.short + self.scale(BASE_EXPIRY_SLACK) + self.caps.max_expiry_lag
    }

    fn timeable(&self, wanted: Duration) -> Ttl {
        let d = round_up(wanted.max(self.caps.min_ttl), self.caps.ttl_granularity);
        let ms = u64::try_from(d.as_millis()).expect("a TTL fits u64 ms");
        Ttl::from_millis(ms).unwrap_or_else(|e| panic!("a scenario TTL of {d:?}: {e}"))
    }
}

impl Default for Timing {
    fn default() -> Self {
        Timing::new(Capabilities::default())
    }
}

/// `d` rounded up to a whole multiple of `step`.
fn round_up(d: Duration, step: Duration) -> Duration {
    let (d, step) = (d.as_nanos(), step.as_nanos());
    let nanos = d.div_ceil(step) * step;
    Duration::from_nanos(u64::try_from(nanos).expect("a rounded duration fits u64 ns"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn the_default_keeps_every_timing_as_written() {
        let t = Timing::default();
        assert!(!t.is_stretched());
        assert_eq!(t.short_ttl().as_duration(), ms(150));
        assert_eq!(t.past_short(), ms(400));
        for base in [1, 10, 150, 300, 1_500, 2_000, 60_000] {
            assert_eq!(t.ttl(base).as_millis(), base);
            assert_eq!(t.at_least(base).as_millis(), base);
            assert_eq!(t.scale(ms(base)), ms(base));
        }
    }

    #[test]
    fn whole_second_leases_stretch_in_proportion_and_are_whole_seconds() {
        let caps = Capabilities::default()
            .with_min_ttl(ms(1_000))
            .with_ttl_granularity(ms(1_000));
        let t = caps.timing();
        assert!(t.is_stretched());
        assert_eq!(t.short_ttl().as_duration(), ms(1_000));
        // The slack past expiry keeps its ratio to the TTL: 250/150 of a second.
        assert_eq!(t.past_short(), ms(1_000 + 1_667));
        assert_eq!(t.scale(ms(300)), ms(2_000));
        assert_eq!(t.ttl(300).as_millis(), 2_000);
        // 2 s × 20/3 = 13.33 s, rounded up to whole seconds.
        assert_eq!(t.ttl(2_000).as_millis(), 14_000);
        // A TTL that only has to be long enough is raised, not stretched.
        assert_eq!(t.at_least(10).as_millis(), 1_000);
        assert_eq!(t.at_least(1_500).as_millis(), 2_000);
        assert_eq!(t.at_least(3_000).as_millis(), 3_000);
        for base in [1, 10, 149, 150, 151, 300, 999, 1_500, 2_000, 20_000, 60_000] {
            for ttl in [t.ttl(base), t.at_least(base)] {
                assert!(ttl.as_duration() >= caps.min_ttl, "{ttl:?}");
                assert_eq!(ttl.as_millis() % 1_000, 0, "{ttl:?} is whole seconds");
            }
            assert!(
                t.ttl(base).as_millis() >= base,
                "never shorter than written"
            );
        }
    }

    #[test]
    fn a_minimum_off_the_granularity_rounds_up_to_it() {
        let t = Capabilities::default()
            .with_min_ttl(ms(1_500))
            .with_ttl_granularity(ms(1_000))
            .timing();
        assert_eq!(t.short_ttl().as_millis(), 2_000);
        assert_eq!(t.at_least(1).as_millis(), 2_000);
    }

    #[test]
    fn an_expiry_lag_lengthens_the_wait_past_expiry_only() {
        let lagging = Capabilities::default()
            .with_max_expiry_lag(ms(500))
            .timing();
        assert_eq!(lagging.past_short(), ms(900));
        assert!(!lagging.is_stretched());
        assert_eq!(lagging.short_ttl().as_millis(), 150);
    }

    #[test]
    #[should_panic(expected = "min_ttl must be whole milliseconds")]
    fn a_minimum_past_the_limit_is_refused() {
        let _ = Capabilities::default().with_min_ttl(MAX_MIN_TTL + ms(1));
    }
}
