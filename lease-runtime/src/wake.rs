//! The timed half of wake-ups: a wake-up sent after a delay, from a timer of this process, and
//! a listener's message delivered as one. The channel itself ([`Wakes`]) is part of the
//! contract, in `lease-core`, because [`LeaseStore::wakes`](lease_core::LeaseStore::wakes)
//! returns it.

use std::time::Duration;

use lease_core::{Kind, Wakes, MAX_WAKE_DELAY};

/// What a store's wake-up side does on a Tokio runtime: [`Wakes`] with timers. Implemented for
/// [`Wakes`]; import it to call `wakes.wake_after(…)` and `wakes.deliver(…)`.
pub trait WakesExt {
    /// A run of `kind` becomes claimable after `delay` (a retry delay, a scheduled start):
    /// the wake-up is sent then, from a timer of this process. A delay over
    /// [`MAX_WAKE_DELAY`] is left to the fallback poll. Must be called within a Tokio runtime
    /// when `delay` is not zero.
    fn wake_after(&self, kind: &Kind, delay: Duration);

    /// A listener's message: `parse` reads the kind it names and how long until that kind's
    /// run is claimable; a message it cannot read wakes every kind (and is logged), so that an
    /// unreadable wake-up costs a claim round, never a run.
    fn deliver(&self, payload: &str, parse: fn(&str) -> Option<(Kind, Duration)>);
}

impl WakesExt for Wakes {
    fn wake_after(&self, kind: &Kind, delay: Duration) {
        if delay.is_zero() {
            return self.wake(kind);
        }
        if delay > MAX_WAKE_DELAY || self.receivers() == 0 {
            return;
        }
        let this = self.clone();
        let kind = kind.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            this.wake(&kind);
        });
    }

    fn deliver(&self, payload: &str, parse: fn(&str) -> Option<(Kind, Duration)>) {
        match parse(payload) {
            Some((kind, delay)) => self.wake_after(&kind, delay),
            None => {
                tracing::warn!(
                    payload,
                    "a wake-up the store cannot read; waking every kind"
                );
                self.wake_all();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_delayed_wake_comes_at_its_time() {
        let wakes = Wakes::new();
        let mut rx = wakes.subscribe();
        let served = [Kind::default()];
        let start = tokio::time::Instant::now();
        wakes.wake_after(&Kind::default(), Duration::from_millis(250));
        rx.woken(&served).await;
        assert_eq!(start.elapsed(), Duration::from_millis(250));
        wakes.wake_after(&Kind::default(), MAX_WAKE_DELAY + Duration::from_secs(1));
        let waited = tokio::time::timeout(MAX_WAKE_DELAY * 2, rx.woken(&served)).await;
        assert!(waited.is_err(), "a delay past MAX_WAKE_DELAY was scheduled");
    }
}
