//! Workers draining a backlog of known size: the one place the bench's drains count the
//! completions that committed, wait for the last, stop the workers and sum their reports.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distribution::{CancellationToken, Ended, Worker, WorkerReport};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::BenchError;

/// The workers of one drain of `jobs` runs.
pub(super) struct Fleet {
    jobs: u64,
    completed: Arc<AtomicU64>,
    all_done: Arc<Notify>,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<distribution::Result<WorkerReport>>>,
}

/// The workers' reports, summed.
pub(super) struct Totals {
    pub(super) completed: u64,
    pub(super) batches: u64,
    pub(super) claimed: u64,
    /// Ends refused, attempts failed, handler errors and abandoned handlers: none in a clean
    /// drain.
    pub(super) not_ok: u64,
}

impl Fleet {
    pub(super) fn new(jobs: usize) -> Fleet {
        Fleet {
            jobs: jobs as u64,
            completed: Arc::new(AtomicU64::new(0)),
            all_done: Arc::new(Notify::new()),
            shutdown: CancellationToken::new(),
            tasks: Vec::new(),
        }
    }

    /// `worker`, counting each completion once the batch carrying it committed.
    pub(super) fn counting(&self, worker: Worker) -> Worker {
        let (completed, all_done, jobs) =
            (self.completed.clone(), self.all_done.clone(), self.jobs);
        worker.on_end(move |report| {
            if report.result.is_ok()
                && report.end.ended() == Ended::Completed
                && completed.fetch_add(1, Ordering::Relaxed) + 1 == jobs
            {
                all_done.notify_one();
            }
        })
    }

    /// The token the workers run until.
    pub(super) fn shutdown(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Runs one worker (its `run` or `run_kinds` future) until the fleet stops.
    pub(super) fn spawn(
        &mut self,
        run: impl Future<Output = distribution::Result<WorkerReport>> + Send + 'static,
    ) {
        self.tasks.push(tokio::spawn(run));
    }

    /// Waits up to `limit` for every job's completion; on time-out, how many completed.
    pub(super) async fn wait(&self, limit: Duration) -> Result<(), u64> {
        match tokio::time::timeout(limit, self.all_done.notified()).await {
            Ok(()) => Ok(()),
            Err(_) => Err(self.completed.load(Ordering::Relaxed)),
        }
    }

    /// Stops the workers and sums their reports.
    pub(super) async fn stop(self) -> Result<Totals, BenchError> {
        self.shutdown.cancel();
        let mut reports: Vec<WorkerReport> = Vec::with_capacity(self.tasks.len());
        for task in self.tasks {
            reports.push(task.await.map_err(|e| BenchError::setup(e.to_string()))??);
        }
        let sum = |f: fn(&WorkerReport) -> u64| reports.iter().map(f).sum::<u64>();
        Ok(Totals {
            completed: sum(|r| r.completed),
            batches: sum(|r| r.batches),
            claimed: sum(|r| r.claimed),
            not_ok: sum(|r| r.refused + r.failed + r.handler_errors + r.abandoned),
        })
    }
}
