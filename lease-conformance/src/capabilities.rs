//! What a backend can time, as its store tells ([`LeaseStore::capabilities`](lease_core::LeaseStore::capabilities)), and the
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
pub const MAX_MIN_TTL: Duration = lease_core::capabilities::MAX_TIMED;

pub use lease_core::Capabilities;

/// The scenario timings of a store with these capabilities.
pub trait TimingOf {
    /// The timings.
    fn timing(&self) -> Timing;
}

impl TimingOf for Capabilities {
    fn timing(&self) -> Timing {
        Timing::new(*self)
    }
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
