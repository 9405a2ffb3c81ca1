//! Retention by the fleet: the [`Purger`] a [`Worker`] runs beside its handlers when
//! [retention](crate::WorkerConfig::with_retention) is on.

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::Worker;
use lease_core::{Kind, Result};

use crate::retention::{Purger, PurgerReport, PURGER_KIND};

impl Worker {
    /// The fleet's purger, if [retention](WorkerConfig::with_retention) is on and the store is
    /// not `memory:`; it stops with `shutdown`, releasing the purge lease.
    pub(super) fn start_purger(
        &self,
        shutdown: &CancellationToken,
    ) -> Option<(CancellationToken, JoinHandle<Result<PurgerReport>>)> {
        let retention = self.config.retention?;
        if self.store.to_string() == "memory:" {
            tracing::info!("retention is off on the memory: store (one process, no fleet)");
            return None;
        }
        let purger = Purger::new(
            self.store.clone(),
            self.store.clone(),
            self.id.clone(),
            self.config.ttl,
        )
        .with_retention(retention)
        .and_then(|p| p.with_every(self.config.retention_every))
        .map(|p| p.with_lease_kind(Kind::new(PURGER_KIND).expect("a valid kind")));
        let purger = match purger {
            Ok(p) => p,
            Err(e) => {
                // Checked in WorkerConfig::check; not reached.
                tracing::error!(error = %e, "retention not started");
                return None;
            }
        };
        let stop = shutdown.child_token();
        let task = tokio::spawn(purger.run(stop.clone()).in_current_span());
        Some((stop, task))
    }
}

/// Stops the worker's purger and waits for it; the runs it purged.
pub(super) async fn stop_purger(
    (stop, task): (CancellationToken, JoinHandle<Result<PurgerReport>>),
) -> u64 {
    stop.cancel();
    match task.await {
        Ok(Ok(report)) => report.purged,
        Ok(Err(e)) => {
            // The purger stopped early (a store that refuses purges, or its lease run ended
            // by an operator); the worker went on serving.
            tracing::error!(error = %e, "the worker's purger had stopped");
            0
        }
        Err(e) => {
            tracing::error!(error = %e, "the worker's purger task failed");
            0
        }
    }
}
