//! [`Worker::drain`]: every job there is to run now, then stop — for tests.

use std::time::Duration;

use lease_core::{Error, InvalidInput, Kind, ListFilter, Queue, Result, RunState, MAX_LIST};
use tokio_util::sync::CancellationToken;

use super::{Kinds, Worker, WorkerReport};

/// How often a drain looks for work left.
const LOOK_EVERY: Duration = Duration::from_millis(5);

impl Worker {
    /// Runs the jobs of `kinds` as [`run_kinds`](Worker::run_kinds) does, and stops by itself
    /// once none of their runs is left to run now: none claimable and none held (by this worker
    /// or any other). A job that a handler inserts, a retry without delay and a lease that
    /// expired are run too. Runs waiting out a delay (a retry's backoff, a start time), and
    /// runs of queues the worker does not serve or that are paused, are left: give the worker
    /// a [`RetryPolicy`](crate::RetryPolicy) without backoff to run retries within the drain.
    /// The report is the worker's, after its ends committed.
    ///
    /// For tests of handlers, on any store: no sleep and no shutdown token.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
    /// use std::sync::Arc;
    /// use serde::{Deserialize, Serialize};
    /// use lease_core::{End, LeaseStore, Ttl, WorkerId};
    /// use lease_runtime::{InsertExt, InsertOpts, JobArgs, Kinds, MemoryLeaseStore, RunContext};
    /// use lease_runtime::{Worker, WorkerConfig};
    ///
    /// #[derive(Serialize, Deserialize)]
    /// struct Resize { width: u32 }
    /// impl JobArgs for Resize {
    ///     const KIND: &'static str = "resize";
    /// }
    ///
    /// let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
    /// for width in [320, 640, 1280] {
    ///     store.insert(&Resize { width }, InsertOpts::new()).await?;
    /// }
    /// let worker = Worker::new(store, WorkerId::new("test")?, WorkerConfig::new(Ttl::from_secs(30)?))?;
    /// let kinds = Kinds::new().job::<Resize, _, _>(|_ctx: RunContext, _args: Resize| async {
    ///     Ok(End::Complete)
    /// });
    /// let report = worker.drain(kinds).await?;
    /// assert_eq!(report.completed, 3);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`run_kinds`](Worker::run_kinds); and the store's error when it cannot list the runs
    /// left.
    pub async fn drain(&self, kinds: Kinds) -> Result<WorkerReport> {
        let served: Vec<Kind> = kinds.routes.iter().map(|r| r.kind.clone()).collect();
        let stop = CancellationToken::new();
        let running = self.run_kinds(kinds, stop.clone());
        tokio::pin!(running);
        loop {
            tokio::select! {
                // Refused at the start (bad kinds), or stopped by a fatal error.
                report = &mut running => return report,
                () = tokio::time::sleep(LOOK_EVERY) => {}
            }
            let left = match self.left_to_run(&served).await {
                Ok(left) => left,
                Err(e) => {
                    stop.cancel();
                    running.await?;
                    return Err(e);
                }
            };
            if !left {
                stop.cancel();
                return running.await;
            }
        }
    }

    /// Whether a runnable run of the `served` kinds, in a queue the worker serves that is not
    /// paused, is claimable or held now.
    async fn left_to_run(&self, served: &[Kind]) -> Result<bool> {
        let paused: Vec<Queue> = match self.store.queues().await {
            Ok(states) => states
                .into_iter()
                .filter(|q| q.paused)
                .map(|q| q.queue)
                .collect(),
            // A store without queues pauses none.
            Err(Error::InvalidInput(InvalidInput::Unsupported { .. })) => Vec::new(),
            Err(e) => return Err(e),
        };
        let queues: Vec<Queue> = self
            .config
            .queues()
            .into_iter()
            .map(|(queue, _)| queue)
            .filter(|queue| !paused.contains(queue))
            .collect();
        for (kind, queue) in served
            .iter()
            .flat_map(|kind| queues.iter().map(move |queue| (kind, queue)))
        {
            let mut filter = ListFilter::new()
                .with_state(RunState::Runnable)
                .with_kind(kind.clone())
                .with_queue(queue.clone())
                .with_limit(MAX_LIST);
            loop {
                let page = self.store.list(&filter).await?;
                let waiting = |r: &lease_core::RunRecord| {
                    r.owner.is_none() && r.not_before.is_some_and(|at| at > r.observed_at)
                };
                if page.iter().any(|r| !waiting(r)) {
                    return Ok(true);
                }
                match page.last() {
                    Some(last) if page.len() == MAX_LIST => {
                        filter = filter.with_after(last.run.clone());
                    }
                    _ => break,
                }
            }
        }
        Ok(false)
    }
}
