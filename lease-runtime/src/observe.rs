//! Metrics and tracing: the names every part of the library reports under, and
//! [`Instrumented`], a store wrapper that records each call.
//!
//! The library reports through the [`metrics`] facade and installs no exporter: an application
//! that installs a recorder (for example `metrics-exporter-prometheus`) gets the series below;
//! one that does not pays a relaxed atomic load per call. Label values are bounded: backends,
//! operation names, verdict reasons, never run or worker ids.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_core::forward::{Call, Forward, Next, Reply};
use lease_core::{Error, Lease, LeaseStore, Result, RunId, WorkerId};
use tracing::Instrument;

pub use crate::refresh::{spawn_counts, CountsRefresher, MIN_COUNTS_EVERY};

/// Counter: store calls, by `backend`, `operation` and `outcome` (`ok`, or [`reason`] of the
/// error).
pub const STORE_OPERATIONS: &str = "lease_store_operations_total";
/// Histogram (seconds): store call latency, by `backend` and `operation`.
pub const STORE_DURATION: &str = "lease_store_operation_duration_seconds";
/// Counter: verdicts the store gave, by `backend` and `reason` (every item of a batch counts).
pub const VERDICTS: &str = "lease_verdicts_total";
/// Counter: fenced writes refused because a newer claim moved the fence (`StaleFence`): each is
/// a double execution that did not happen. Counted where the verdict is decided
/// ([`count_stale`]), so writes through adapter-specific fenced transactions and scripts count
/// too.
pub const STALE_WRITES_REFUSED: &str = "lease_stale_writes_refused_total";
/// Counter: `claim_next` calls that found nothing to claim, by `backend`.
pub const EMPTY_CLAIMS: &str = "lease_claim_next_empty_total";
/// Histogram (seconds): a renewal's round trip, send to answer, by `via` (`scope` or `hub`).
pub const RENEWAL_DURATION: &str = "lease_renewal_duration_seconds";
/// Histogram (seconds): how much of the local deadline was left when a renewal succeeded —
/// how close workers run to losing their leases. Near zero means leases are nearly lost.
pub const RENEWAL_TIME_LEFT: &str = "lease_renewal_time_left_seconds";
/// Counter: run scopes ended, by `reason` (`rejected`, `deadline`, `released`, `suspended`,
/// `completed`). `rejected` and `deadline` are leases lost. (A scope cancelled through its
/// parent token, such as a worker's shutdown grace ending, is not counted here.)
pub const SCOPE_CANCELLATIONS: &str = "lease_scope_cancellations_total";
/// Gauge: leases driven by run scopes in this process.
pub const LEASES_HELD: &str = "lease_leases_held";
/// Counter: lease ends a [`Worker`](crate::Worker) decided, by `end` (`complete`,
/// `complete-with`, `release`, `suspend`) and `outcome` (`committed`, `refused`, `failed`).
pub const WORKER_ENDS: &str = "lease_worker_ends_total";
/// Histogram: ends per group-committed `end_many` of a [`Worker`](crate::Worker).
pub const WORKER_BATCH_SIZE: &str = "lease_worker_batch_size";
/// Histogram: how long a [`Worker`](crate::Worker)'s handlers ran, by `outcome` (`ok`,
/// `error`, `panic`, `abandoned`).
pub const WORKER_HANDLER_DURATION: &str = "lease_worker_handler_duration_seconds";
/// Histogram: the attempt on which each run a [`Worker`](crate::Worker) completed was
/// completed (1: the first claim did it), recorded once its batch committed. A rise means runs
/// fail and are retried before they complete.
pub const ATTEMPTS_PER_COMPLETION: &str = "lease_worker_attempts_per_completed_run";
/// Gauge: handlers running in this process's [`Worker`](crate::Worker)s.
pub const WORKER_IN_FLIGHT: &str = "lease_worker_jobs_in_flight";
/// Gauge: runs by `state` (`claimable`, `held`, `delayed`, `suspended`, `completed`, `failed`,
/// `cancelled`), as the last [`record_counts`] set them from a store's
/// [`count`](lease_core::LeaseStore::count); [`spawn_counts`] refreshes it.
pub const RUNS: &str = "lease_runs";
/// Gauge (seconds): the queue's lag, how long the run that has waited longest has been
/// claimable, on the store's clock (0 when no run is claimable), as the last
/// [`record_counts`] set it ([`RunCounts::oldest_claimable_age`](lease_core::RunCounts::oldest_claimable_age)).
/// Not set from a store that cannot tell (etcd).
pub const QUEUE_LAG: &str = "lease_queue_lag_seconds";
/// Gauge (seconds): how long the lease held longest has been held, on the store's clock (0
/// when none is held), as the last [`record_counts`] set it
/// ([`RunCounts::longest_held`](lease_core::RunCounts::longest_held)): a handler stuck while its
/// heartbeats go on shows here. Not set from a store that cannot tell (etcd).
pub const LONGEST_HELD: &str = "lease_longest_held_seconds";
/// Histogram (seconds): how long each run a [`Worker`](crate::Worker) claimed had been
/// claimable when its claim took it, on the store's clock ([`Lease::waited`](lease_core::Lease::waited)),
/// by `kind`: the wait from claimable to claimed, which grows when the fleet falls behind.
pub const WORKER_WAIT: &str = "lease_worker_wait_seconds";
/// Gauge: each kind's runnable runs, by `kind` and `state` (`runnable`: claimable, held or
/// delayed; `claimable`: claimable now), as the last [`record_kind_counts`] set them from a
/// store's [`count_kinds`](lease_core::LeaseStore::count_kinds); [`spawn_counts`] refreshes it,
/// and sets a kind that has no runnable run left to 0. Not set from a store that cannot
/// count by kind (etcd).
pub const KIND_RUNS: &str = "lease_kind_runs";
/// Gauge (seconds): each kind's queue lag, by `kind`: how long its longest-waiting claimable
/// run has been claimable, on the store's clock (0 when none is), as the last
/// [`record_kind_counts`] set it.
pub const KIND_QUEUE_LAG: &str = "lease_kind_queue_lag_seconds";
/// Counter: handlers that failed, by `outcome` (`error`, `panic`) and what the
/// [`Worker`](crate::Worker) did with the run (`then`: `retry`, `fail`, `release`).
pub const WORKER_HANDLER_ERRORS: &str = "lease_worker_handler_errors_total";

/// Every series the library reports: (name, type, unit, labels, meaning), for documentation
/// and for exporters that describe series up front.
pub const SERIES: &[(&str, &str, &str, &str, &str)] = &[
    (
        STORE_OPERATIONS,
        "counter",
        "calls",
        "backend, operation, outcome",
        "store calls through an Instrumented store, by outcome (ok or the error's reason)",
    ),
    (
        STORE_DURATION,
        "histogram",
        "seconds",
        "backend, operation",
        "store call latency",
    ),
    (
        VERDICTS,
        "counter",
        "verdicts",
        "backend, reason",
        "refusals by the store, every batch item counted",
    ),
    (
        STALE_WRITES_REFUSED,
        "counter",
        "writes",
        "",
        "fenced writes refused with StaleFence: double executions that did not happen",
    ),
    (
        EMPTY_CLAIMS,
        "counter",
        "calls",
        "backend",
        "claim_next calls that found nothing",
    ),
    (
        RENEWAL_DURATION,
        "histogram",
        "seconds",
        "via",
        "renewal round trip, send to answer",
    ),
    (
        RENEWAL_TIME_LEFT,
        "histogram",
        "seconds",
        "",
        "local deadline left when a renewal succeeded",
    ),
    (
        SCOPE_CANCELLATIONS,
        "counter",
        "scopes",
        "reason",
        "scopes ended; rejected and deadline are lost leases",
    ),
    (
        LEASES_HELD,
        "gauge",
        "leases",
        "",
        "leases driven by run scopes in this process",
    ),
    (
        WORKER_ENDS,
        "counter",
        "ends",
        "end, outcome, kind, queue",
        "lease ends a Worker decided",
    ),
    (
        WORKER_BATCH_SIZE,
        "histogram",
        "ends",
        "",
        "ends per group-committed end_many of a Worker",
    ),
    (
        WORKER_HANDLER_DURATION,
        "histogram",
        "seconds",
        "outcome, kind, queue",
        "how long a Worker's handlers ran",
    ),
    (
        WORKER_IN_FLIGHT,
        "gauge",
        "jobs",
        "",
        "handlers running in this process's Workers",
    ),
    (
        RUNS,
        "gauge",
        "runs",
        "state",
        "runs by state, from the store's count (spawn_counts refreshes it)",
    ),
    (
        WORKER_WAIT,
        "histogram",
        "seconds",
        "kind, queue",
        "how long each run a Worker claimed had been claimable when the claim took it, on the store's clock",
    ),
    (
        KIND_RUNS,
        "gauge",
        "runs",
        "kind, state",
        "each kind's runnable and claimable runs, from the store's count_kinds (spawn_counts refreshes it)",
    ),
    (
        KIND_QUEUE_LAG,
        "gauge",
        "seconds",
        "kind",
        "each kind's queue lag: how long its longest-waiting claimable run has been claimable",
    ),
    (
        ATTEMPTS_PER_COMPLETION,
        "histogram",
        "attempts",
        "kind, queue",
        "the attempt on which each completed run was completed, after its batch committed",
    ),
    (
        QUEUE_LAG,
        "gauge",
        "seconds",
        "",
        "how long the longest-waiting claimable run has waited, on the store's clock; 0 when none waits",
    ),
    (
        LONGEST_HELD,
        "gauge",
        "seconds",
        "",
        "how long the lease held longest has been held, on the store's clock; 0 when none is held",
    ),
    (
        WORKER_HANDLER_ERRORS,
        "counter",
        "handlers",
        "outcome, then, kind, queue",
        "handlers that failed, and what became of their runs",
    ),
];

/// Describes every series to the installed recorder (help text and unit), so an exporter can
/// print them before they are first reported. Call once after installing a recorder.
pub fn describe() {
    for (name, kind, unit, _, help) in SERIES {
        let unit = match *unit {
            "seconds" => metrics::Unit::Seconds,
            _ => metrics::Unit::Count,
        };
        match *kind {
            "counter" => metrics::describe_counter!(*name, unit, *help),
            "gauge" => metrics::describe_gauge!(*name, unit, *help),
            _ => metrics::describe_histogram!(*name, unit, *help),
        }
    }
}

/// A bounded label for an error: `not_found`, `stale_fence`, `unavailable`, … (the error's
/// [`code`](Error::code)).
pub fn reason(e: &Error) -> &'static str {
    e.code()
}

/// Sets the [`RUNS`] gauge, one series per state, and the [`QUEUE_LAG`] and [`LONGEST_HELD`]
/// gauges from `counts`.
pub fn record_counts(counts: &lease_core::RunCounts) {
    for (state, n) in counts.by_state() {
        metrics::gauge!(RUNS, "state" => state).set(n as f64);
    }
    match counts.oldest_claimable_age {
        Some(age) => metrics::gauge!(QUEUE_LAG).set(age.as_secs_f64()),
        None if counts.claimable == 0 => metrics::gauge!(QUEUE_LAG).set(0.0),
        None => {} // runs wait, but the store cannot tell for how long
    }
    match counts.longest_held {
        Some(held) => metrics::gauge!(LONGEST_HELD).set(held.as_secs_f64()),
        None if counts.held == 0 => metrics::gauge!(LONGEST_HELD).set(0.0),
        None => {} // leases are held, but the store cannot tell since when
    }
}

/// Sets the [`KIND_RUNS`] and [`KIND_QUEUE_LAG`] gauges, one series per kind, from `kinds`.
pub fn record_kind_counts(kinds: &[lease_core::KindCounts]) {
    for k in kinds {
        let kind = k.kind.to_string();
        metrics::gauge!(KIND_RUNS, "kind" => kind.clone(), "state" => "runnable")
            .set(k.runnable as f64);
        metrics::gauge!(KIND_RUNS, "kind" => kind.clone(), "state" => "claimable")
            .set(k.claimable as f64);
        let lag = k.oldest_claimable_age.map_or(0.0, |age| age.as_secs_f64());
        metrics::gauge!(KIND_QUEUE_LAG, "kind" => kind).set(lag);
    }
}

/// Counts a stale write refused ([`STALE_WRITES_REFUSED`]) when `verdict` is
/// [`Error::StaleFence`], and hands `verdict` back unchanged.
///
/// The contract's [`fenced_verdict`](lease_core::backend::fenced_verdict) counts nothing; a
/// backend passes its answer through this where it decides a fenced write (the memory store,
/// and the Postgres, Redis and etcd adapters, their fenced transactions and scripts included),
/// so every stale write refused is counted once, wrapped in an [`Instrumented`] or not.
///
/// ```
/// use lease_core::{backend::fenced_verdict, Error, Fence, RunId, RunState};
/// use lease_runtime::observe::count_stale;
/// let run = RunId::new("r").unwrap();
/// let (one, two) = (Fence::new(1).unwrap(), Fence::new(2).unwrap());
/// let verdict = count_stale(fenced_verdict(&run, one, two, RunState::Runnable, true));
/// assert!(matches!(verdict, Err(Error::StaleFence { .. })));
/// ```
pub fn count_stale<T>(verdict: Result<T>) -> Result<T> {
    if let Err(Error::StaleFence { .. }) = &verdict {
        metrics::counter!(STALE_WRITES_REFUSED).increment(1);
    }
    verdict
}

/// Wraps any store and records every call: the [`STORE_OPERATIONS`] counter and
/// [`STORE_DURATION`] histogram by backend, operation and outcome, [`VERDICTS`] per item,
/// [`EMPTY_CLAIMS`], and one `debug` span per call named `store` with the `backend`,
/// `operation`, `run`, `fence` and `worker` it concerns; each verdict is logged at `info`.
///
/// The facade's `connect` wraps every store it returns in one.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> lease_core::Result<()> {
/// use std::sync::Arc;
/// use lease_core::{LeaseStore, RunId};
/// use lease_runtime::{Instrumented, MemoryLeaseStore};
///
/// let store: Arc<dyn LeaseStore> = Instrumented::wrap(Arc::new(MemoryLeaseStore::new()), "memory");
/// store.create(&RunId::new("order-42")?).await?; // counted and traced
/// assert_eq!(store.to_string(), "memory:");
/// # Ok(()) }
/// ```
pub struct Instrumented {
    inner: Arc<dyn LeaseStore>,
    backend: &'static str,
}

impl Instrumented {
    /// `inner`, instrumented under the label `backend` (`memory`, `postgres`, `redis`, …).
    pub fn wrap(inner: Arc<dyn LeaseStore>, backend: &'static str) -> Arc<dyn LeaseStore> {
        Arc::new(Instrumented { inner, backend })
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<dyn LeaseStore> {
        &self.inner
    }

    fn finish<T>(&self, op: &'static str, started: Instant, result: &Result<T>) {
        let outcome = match result {
            Ok(_) => "ok",
            Err(e) => {
                self.verdict(e);
                reason(e)
            }
        };
        metrics::counter!(STORE_OPERATIONS, "backend" => self.backend, "operation" => op, "outcome" => outcome)
            .increment(1);
        metrics::histogram!(STORE_DURATION, "backend" => self.backend, "operation" => op)
            .record(started.elapsed().as_secs_f64());
    }

    fn verdict(&self, e: &Error) {
        if e.is_verdict() {
            metrics::counter!(VERDICTS, "backend" => self.backend, "reason" => reason(e))
                .increment(1);
            tracing::info!(backend = self.backend, reason = reason(e), error = %e, "store verdict");
        }
    }

    async fn call<T, F>(&self, op: &'static str, span: tracing::Span, f: F) -> Result<T>
    where
        F: std::future::Future<Output = Result<T>>,
    {
        let started = Instant::now();
        let result = f.instrument(span).await;
        self.finish(op, started, &result);
        result
    }
}

fn span(backend: &'static str, op: &'static str) -> tracing::Span {
    tracing::debug_span!(
        "store",
        backend,
        operation = op,
        run = tracing::field::Empty,
        fence = tracing::field::Empty,
        worker = tracing::field::Empty,
        items = tracing::field::Empty,
    )
}

fn on_run(span: tracing::Span, run: &RunId) -> tracing::Span {
    span.record("run", tracing::field::display(run));
    span
}

fn on_lease(span: tracing::Span, lease: &Lease) -> tracing::Span {
    span.record("run", tracing::field::display(lease.run()));
    span.record("fence", lease.fence().get());
    span.record("worker", tracing::field::display(lease.owner()));
    span
}

fn on_worker(span: tracing::Span, worker: &WorkerId) -> tracing::Span {
    span.record("worker", tracing::field::display(worker));
    span
}

fn on_items(span: tracing::Span, n: usize) -> tracing::Span {
    span.record("items", n);
    span
}

impl fmt::Debug for Instrumented {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Instrumented")
            .field("backend", &self.backend)
            .field("inner", &self.inner)
            .finish()
    }
}

impl fmt::Display for Instrumented {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.inner, f)
    }
}

/// Every call counted, timed and traced, by the forwarding base: a method added to the trait
/// is instrumented too.
#[async_trait::async_trait]
impl Forward for Instrumented {
    fn inner(&self) -> &dyn LeaseStore {
        &*self.inner
    }

    async fn around<T: Reply>(&self, call: Call<'_>, next: Next<'_, T>) -> Result<T> {
        // One series for every claim of the next runs: of a queue and kind, of a kind, or of
        // the default kind.
        let op = match call.operation {
            "claim_next_kind" | "claim_next_in" => "claim_next",
            op => op,
        };
        let mut s = span(self.backend, op);
        if let Some(lease) = call.lease {
            s = on_lease(s, lease);
        } else if let Some(run) = call.run {
            s = on_run(s, run);
        }
        if let Some(worker) = call.worker {
            s = on_worker(s, worker);
        }
        if let Some(items) = call.items {
            s = on_items(s, items);
        }
        let result = self.call(op, s, next.run()).await;
        if let Ok(reply) = &result {
            for e in reply.item_errors() {
                self.verdict(e);
            }
            if op == "claim_next" && reply.is_empty() {
                metrics::counter!(EMPTY_CLAIMS, "backend" => self.backend).increment(1);
            }
            if let Some(lease) = reply.lease().filter(|_| op == "claim") {
                tracing::debug!(
                    run = %lease.run(),
                    fence = lease.fence().get(),
                    worker = %lease.owner(),
                    "claimed"
                );
            }
        }
        result
    }
}

/// Records a renewal that succeeded: its round trip, and the local deadline it had left.
pub(crate) fn renewal(via: &'static str, took: Duration, left: Duration) {
    metrics::histogram!(RENEWAL_DURATION, "via" => via).record(took.as_secs_f64());
    metrics::histogram!(RENEWAL_TIME_LEFT).record(left.as_secs_f64());
}
