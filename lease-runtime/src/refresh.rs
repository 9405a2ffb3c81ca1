//! [`spawn_counts`]: the [`RUNS`](crate::observe::RUNS) gauge kept fresh by the library.

use std::sync::Arc;
use std::time::Duration;

use lease_core::{Error, LeaseStore};
use tokio::task::JoinHandle;

use crate::observe::record_counts;

/// The shortest period of [`spawn_counts`]: a second (each refresh is one `count` call, whose
/// server work is bounded but not free).
pub const MIN_COUNTS_EVERY: Duration = Duration::from_secs(1);

/// The task [`spawn_counts`] started; it stops when this is dropped (or [`stop`](Self::stop)ped).
#[derive(Debug)]
#[must_use = "the refresh stops when this is dropped"]
pub struct CountsRefresher {
    task: JoinHandle<()>,
}

impl CountsRefresher {
    /// Stops the refresh.
    pub fn stop(self) {
        drop(self);
    }

    /// Whether the task has ended (it ends by itself only for a store that cannot count).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

impl Drop for CountsRefresher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Sets the [`RUNS`](crate::observe::RUNS) and [`QUEUE_LAG`](crate::observe::QUEUE_LAG)
/// gauges from `store`'s [`count`](LeaseStore::count), and the per-kind
/// [`KIND_RUNS`](crate::observe::KIND_RUNS) and
/// [`KIND_QUEUE_LAG`](crate::observe::KIND_QUEUE_LAG) from its
/// [`count_kinds`](LeaseStore::count_kinds) (where it counts by kind), now and then every
/// `every` (at least [`MIN_COUNTS_EVERY`]),
/// until the returned [`CountsRefresher`] is dropped. One process of the fleet is enough: the
/// gauge says what is in the store, not what this process did. A failed count is logged and
/// tried again at the next period, the gauge keeping its last figures; a store that cannot
/// count (`Unsupported`) is logged once and the task ends. Call it inside a Tokio runtime.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use lease_core::LeaseStore;
/// use lease_runtime::{observe, MemoryLeaseStore};
///
/// let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
/// let counts = observe::spawn_counts(store, Duration::from_secs(15));
/// // ... serve; the gauge lease_runs{state=...} follows the store ...
/// counts.stop();
/// # Ok(()) }
/// ```
pub fn spawn_counts(store: Arc<dyn LeaseStore>, every: Duration) -> CountsRefresher {
    let every = every.max(MIN_COUNTS_EVERY);
    let task = tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The kinds reported last, to set those that emptied to 0; None once the store said
        // it cannot count by kind.
        let mut kinds: Option<std::collections::BTreeSet<lease_core::Kind>> =
            Some(Default::default());
        loop {
            ticks.tick().await;
            if let Some(seen) = kinds.as_mut() {
                match store.count_kinds().await {
                    Ok(now) => {
                        crate::observe::record_kind_counts(&now);
                        let listed: std::collections::BTreeSet<lease_core::Kind> =
                            now.iter().map(|k| k.kind.clone()).collect();
                        let gone: Vec<lease_core::KindCounts> = seen
                            .difference(&listed)
                            .map(|kind| lease_core::KindCounts::new(kind.clone(), 0, 0, None))
                            .collect();
                        crate::observe::record_kind_counts(&gone);
                        *seen = listed;
                    }
                    Err(Error::InvalidInput(_)) => {
                        tracing::debug!(store = %store, "the store does not count by kind; the lease_kind_* gauges are not set");
                        kinds = None;
                    }
                    Err(e) => {
                        tracing::warn!(store = %store, error = %e, "count_kinds failed; the lease_kind_* gauges keep their last figures");
                    }
                }
            }
            match store.count().await {
                Ok(counts) => record_counts(&counts),
                Err(e @ Error::InvalidInput(_)) => {
                    tracing::error!(store = %store, error = %e, "the store cannot count; the lease_runs gauge is not refreshed");
                    return;
                }
                Err(e) => {
                    tracing::warn!(store = %store, error = %e, "count failed; the lease_runs gauge keeps its last figures");
                }
            }
        }
    });
    CountsRefresher { task }
}
