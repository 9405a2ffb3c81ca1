//! Wake-ups: a store tells idle workers that a run became claimable, so they claim at once
//! instead of at their next poll.
//!
//! A wake-up is only a hint. It carries no run and grants nothing: a woken worker still claims
//! through the store, and a wake-up that is lost (a dropped connection, a full buffer) costs
//! at most one poll interval, because a worker that has wake-ups still polls, rarely. That is
//! why a lost or duplicated wake-up can never cause a double execution or a stranded run.
//!
//! This is the channel only, with no timer and no task: [`Wakes`] appears in
//! [`LeaseStore::wakes`](crate::LeaseStore::wakes), so it belongs to the contract, and it needs
//! Tokio's `sync` feature alone. Delayed wake-ups and the listener that feeds a store's
//! wake-ups run on a Tokio runtime, in `lease-runtime`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;

use crate::kind::Kind;

/// How many wake-ups a receiver may fall behind before it is told it missed some (and then
/// wakes anyway).
const BUFFER: usize = 1024;

/// Reads a `<kind> <ms>` wake-up payload (split at the last space: a kind may hold spaces):
/// the kind of the run that became claimable and the milliseconds until it is. The Postgres
/// trigger's notifications and the etcd wake keys carry it; give it to `deliver`
/// (`lease-runtime`'s `WakesExt`, which sends the wake-up after the delay). `None` for
/// anything else.
///
/// ```
/// use std::time::Duration;
/// use lease_core::{parse_kind_delay, Kind};
/// assert_eq!(
///     parse_kind_delay("send mail 250"),
///     Some((Kind::new("send mail").unwrap(), Duration::from_millis(250)))
/// );
/// assert_eq!(parse_kind_delay("no-delay"), None);
/// ```
pub fn parse_kind_delay(payload: &str) -> Option<(Kind, Duration)> {
    let (kind, ms) = payload.rsplit_once(' ')?;
    Some((
        Kind::new(kind).ok()?,
        Duration::from_millis(ms.parse().ok()?),
    ))
}

/// What a wake-up says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wake {
    /// A run of this kind became claimable.
    Kind(Kind),
    /// Something may have been missed (the listener reconnected, a receiver fell behind):
    /// every kind should be tried.
    All,
}

/// The sending side of a store's wake-ups, shared by every worker of the store: one listener
/// per store feeds it, however many workers wait on it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use lease_core::{Kind, Wakes};
/// let wakes = Wakes::new();
/// let mut rx = wakes.subscribe();
/// wakes.wake(&Kind::default());
/// let served = [Kind::default()];
/// rx.woken(&served).await; // returns at once: a run of a served kind became claimable
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Wakes {
    tx: Arc<broadcast::Sender<Wake>>,
    /// Whether wake-ups are being delivered now (the store's listener is connected).
    live: Arc<AtomicBool>,
}

impl Default for Wakes {
    fn default() -> Self {
        Wakes::new()
    }
}

impl Wakes {
    /// A channel with no receiver yet, [live](Wakes::set_live).
    pub fn new() -> Wakes {
        let (tx, _) = broadcast::channel(BUFFER);
        Wakes {
            tx: Arc::new(tx),
            live: Arc::new(AtomicBool::new(true)),
        }
    }

    /// A channel that is not live until its listener says so
    /// ([`set_live`](Wakes::set_live)).
    pub fn not_live() -> Wakes {
        let wakes = Wakes::new();
        wakes.live.store(false, Ordering::Release);
        wakes
    }

    /// Whether wake-ups are delivered now. A store's listener clears it while it has no
    /// session (cut, unreachable, refused), and sets it when it listens again (then sending
    /// [`Wake::All`] for what it may have missed). Workers wait for wake-ups only while it is
    /// set, and otherwise poll as on a store without them.
    pub fn set_live(&self, live: bool) {
        self.live.store(live, Ordering::Release);
    }

    /// A run of `kind` is claimable now.
    pub fn wake(&self, kind: &Kind) {
        let _ = self.tx.send(Wake::Kind(kind.clone()));
    }

    /// Every kind may have a claimable run the receivers were not told of.
    pub fn wake_all(&self) {
        let _ = self.tx.send(Wake::All);
    }

    /// A receiver of the wake-ups sent from now on.
    pub fn subscribe(&self) -> WakeReceiver {
        WakeReceiver {
            rx: self.tx.subscribe(),
            live: self.live.clone(),
        }
    }

    /// How many receivers are subscribed.
    pub fn receivers(&self) -> usize {
        self.tx.receiver_count()
    }
}

/// One worker's end of a store's wake-ups.
#[derive(Debug)]
pub struct WakeReceiver {
    rx: broadcast::Receiver<Wake>,
    live: Arc<AtomicBool>,
}

impl WakeReceiver {
    /// Whether wake-ups are delivered now ([`Wakes::set_live`]); while they are not, wait
    /// by polling.
    pub fn is_live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    /// Forgets the wake-ups received so far: call it just before claiming, so that only what
    /// is sent after the claim began wakes the next wait (nothing sent during the claim is
    /// lost: it wakes that wait at once).
    pub fn clear(&mut self) {
        loop {
            match self.rx.try_recv() {
                Ok(_) | Err(broadcast::error::TryRecvError::Lagged(_)) => continue,
                Err(_) => return,
            }
        }
    }

    /// Returns when a wake-up concerns one of `kinds` (or every kind), or never if the store
    /// stopped sending (callers wait on it alongside a fallback poll).
    pub async fn woken(&mut self, kinds: &[Kind]) {
        loop {
            match self.rx.recv().await {
                Ok(Wake::Kind(kind)) if !kinds.contains(&kind) => continue,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => return,
                Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(name: &str) -> Kind {
        Kind::new(name).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_receiver_wakes_only_for_its_kinds_or_for_all() {
        let wakes = Wakes::new();
        let mut rx = wakes.subscribe();
        wakes.wake(&kind("email"));
        let served = [kind("charge")];
        let waited = tokio::time::timeout(Duration::from_secs(1), rx.woken(&served)).await;
        assert!(
            waited.is_err(),
            "a wake-up for another kind woke the receiver"
        );
        wakes.wake(&kind("charge"));
        tokio::time::timeout(Duration::from_secs(1), rx.woken(&served))
            .await
            .expect("its kind's wake-up did not wake it");
        wakes.wake_all();
        tokio::time::timeout(Duration::from_secs(1), rx.woken(&served))
            .await
            .expect("a wake-up for every kind did not wake it");
    }

    #[tokio::test(start_paused = true)]
    async fn clear_forgets_what_came_before_and_keeps_what_comes_after() {
        let wakes = Wakes::new();
        let mut rx = wakes.subscribe();
        let served = [Kind::default()];
        for _ in 0..(BUFFER + 10) {
            wakes.wake(&Kind::default()); // lagging past the buffer too
        }
        rx.clear();
        let waited = tokio::time::timeout(Duration::from_secs(1), rx.woken(&served)).await;
        assert!(waited.is_err(), "cleared wake-ups woke the receiver");
        wakes.wake(&Kind::default());
        rx.woken(&served).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_receiver_that_falls_behind_wakes() {
        let wakes = Wakes::new();
        let mut rx = wakes.subscribe();
        for _ in 0..(BUFFER + 1) {
            wakes.wake(&kind("other"));
        }
        // Every one of them was for a kind it does not serve, but it missed one: it wakes.
        tokio::time::timeout(Duration::from_secs(1), rx.woken(&[Kind::default()]))
            .await
            .expect("a lagging receiver did not wake");
    }
}
