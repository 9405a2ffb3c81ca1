//! One claimed run: its handler under the attempt deadline and the shutdown's grace, and how
//! its lease ends.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lease_core::{End, Ending, Error};
use tokio::sync::mpsc;
use tokio::task::{JoinError, JoinHandle};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::observe;
use crate::scope::{CancelReason, RunScope};

use super::batcher::{submit, Pending};
use super::config::RetryPolicy;
use super::context::{bump, Counters, Handler, RunContext};
use super::kinds::Slot;

/// What a job needs: its lease's scope, its handler, where its end goes, and its limits.
pub(super) struct Job {
    pub(super) scope: Arc<RunScope>,
    pub(super) handler: Arc<dyn Handler>,
    pub(super) ends: mpsc::UnboundedSender<Pending>,
    pub(super) counters: Arc<Counters>,
    pub(super) shutdown: CancellationToken,
    /// Cancelled when the shutdown's grace period ends.
    pub(super) abandon: CancellationToken,
    pub(super) retry: RetryPolicy,
    pub(super) attempt_timeout: Option<Duration>,
    pub(super) grace: Duration,
    /// Set once a handler of this worker blocked its thread past its stop: from then on each
    /// handler runs on a thread of its own (the runtime's blocking pool), so a handler that
    /// blocks again leaves the runtime's threads to the worker's deadlines, renewals and
    /// shutdown.
    pub(super) own_threads: Arc<AtomicBool>,
    pub(super) _slot: Slot,
}

/// How a failed attempt ends: retried after the policy's delay (the attempt counted), or failed
/// with `why` at the policy's last attempt.
fn after_failure(retry: &RetryPolicy, attempt: u64, why: &str) -> End {
    let reason = lease_core::sanitize_reason(why);
    if retry.gives_up(attempt) {
        End::Fail(reason)
    } else {
        End::AttemptFailed {
            retry_after: retry.delay(attempt),
            reason,
        }
    }
}

/// A panic's message, when it carries one.
fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned());
    match text {
        Some(text) => format!("handler panicked: {text}"),
        None => "handler panicked".to_owned(),
    }
}

/// Why a handler's token was cancelled before it returned, as far as the end goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stopped {
    /// Not cancelled.
    No,
    /// The shutdown's grace ended: the run is handed back at once, no attempt counted.
    Shutdown,
    /// The attempt deadline passed: a failed attempt.
    AttemptDeadline,
    /// The lease's scope was cancelled (its local deadline, a refused renewal): a failed
    /// attempt, if the lease can still be ended.
    Scope,
}

/// One claimed run: its handler (unless its scope is already cancelled, the worker is shutting
/// down, or the run's attempt budget is spent), then the end of its lease through the batcher.
pub(super) async fn job(job: Job) {
    let Job {
        scope,
        handler,
        ends,
        counters,
        shutdown,
        abandon,
        retry,
        attempt_timeout,
        grace,
        own_threads,
        _slot,
    } = job;
    let run = scope.run().clone();
    let lease = scope.lease();
    let (fence, attempt) = (lease.fence(), lease.attempt());
    // The metrics' labels: the kinds and queues a worker serves, so bounded by its lanes.
    let (kind, queue) = (lease.kind().to_string(), lease.queue().to_string());
    // The effect the handler handed in (`RunContext::set_effect`), if it ran.
    let mut effect_slot = None;
    let (end, by_handler) = if let Some(max) = retry.max_attempts().filter(|max| attempt > *max) {
        // Claimed past the budget: every earlier attempt failed, timed out or vanished (a
        // crash leaves no end behind, only a count). Never run it again.
        bump(&counters.exhausted);
        let reason = crate::scope::exhausted_reason(attempt - 1, max);
        tracing::warn!(
            attempt,
            max,
            "attempt budget spent; failing the run without running it"
        );
        (End::Fail(reason), false)
    } else if scope.is_cancelled() || shutdown.is_cancelled() {
        // Never start work on a lease that may be lost, or after the shutdown began; give the
        // run back (a fenced write: refused harmlessly if the lease is gone).
        bump(&counters.not_started);
        (End::Release, false)
    } else {
        bump(&counters.started);
        let token = scope.token().child_token();
        let ctx = RunContext {
            payload: scope.lease().payload_shared(),
            scope: scope.clone(),
            token: token.clone(),
            effect: Arc::default(),
        };
        effect_slot = Some(ctx.effect.clone());
        let started = Instant::now();
        metrics::gauge!(observe::WORKER_IN_FLIGHT).increment(1.0);
        let work = handler.call(ctx).instrument(tracing::Span::current());
        let mut task = if own_threads.load(Ordering::Relaxed) {
            let runtime = tokio::runtime::Handle::current();
            tokio::task::spawn_blocking(move || runtime.block_on(work))
        } else {
            tokio::spawn(work)
        };
        let deadline = attempt_timeout.map(|d| started + d);
        let mut stopped = Stopped::No;
        // A handler whose lease is lost is cancelled through its token and may finish (its
        // writes are fenced); one still running when the shutdown's grace ends is stopped, and
        // so is one still running a grace after its attempt deadline. Stopped means aborted and
        // no longer waited for: a handler blocking its thread never yields, so its abort lands
        // only when (if ever) it does.
        let joined = tokio::select! {
            joined = &mut task => Some(joined),
            _ = abandon.cancelled() => {
                stopped = Stopped::Shutdown;
                stop(&mut task).await
            }
            () = sleep_until_opt(deadline) => {
                stopped = Stopped::AttemptDeadline;
                bump(&counters.timed_out);
                tracing::warn!(timeout = ?attempt_timeout, "attempt deadline passed; cancelling the handler");
                token.cancel();
                tokio::select! {
                    joined = &mut task => Some(joined),
                    () = tokio::time::sleep(grace) => {
                        tracing::warn!(?grace, "handler ignored its cancelled token past the grace; aborting it");
                        stop(&mut task).await
                    }
                    _ = abandon.cancelled() => stop(&mut task).await,
                }
            }
        };
        if joined.is_none() && !own_threads.swap(true, Ordering::Relaxed) {
            // Aborted and still running: it blocks a runtime thread. A handler blocked again
            // by each retry would take another each time, until none is left for the worker.
            tracing::warn!(
                "a handler blocked its thread past its stop; this worker's handlers run on \
                 threads of their own from now on (the runtime's blocking pool)"
            );
        }
        let outcome = match joined {
            Some(Ok(returned)) => Outcome::Returned(returned),
            Some(Err(e)) if e.is_panic() => Outcome::Panicked(panic_message(e.into_panic())),
            Some(Err(_)) | None => Outcome::Stopped,
        };
        if stopped == Stopped::No && scope.is_cancelled() {
            stopped = if abandon.is_cancelled() {
                Stopped::Shutdown
            } else {
                Stopped::Scope
            };
        }
        metrics::gauge!(observe::WORKER_IN_FLIGHT).decrement(1.0);
        let label = match &outcome {
            Outcome::Returned(Ok(_)) => "ok",
            Outcome::Returned(Err(_)) => "error",
            Outcome::Panicked(_) => "panic",
            Outcome::Stopped if stopped == Stopped::AttemptDeadline => "timeout",
            Outcome::Stopped => "abandoned",
        };
        metrics::histogram!(observe::WORKER_HANDLER_DURATION, "outcome" => label, "kind" => kind.clone(), "queue" => queue.clone())
            .record(started.elapsed().as_secs_f64());
        let failed = |then: &End| {
            let then = match then {
                End::Fail(_) => "fail",
                End::AttemptFailed { .. } | End::RetryAfter(_) => "retry",
                _ => "release",
            };
            metrics::counter!(observe::WORKER_HANDLER_ERRORS, "outcome" => label, "then" => then, "kind" => kind.clone(), "queue" => queue.clone())
                .increment(1);
        };
        let why_stopped = || match stopped {
            Stopped::AttemptDeadline => format!(
                "attempt timed out after {:?}",
                attempt_timeout.unwrap_or_default()
            ),
            _ => "the lease's local deadline passed before the handler returned".to_owned(),
        };
        match outcome {
            // Returned after a cancellation that was not the shutdown's: giving the run back
            // would refund the attempt, so a handler that hangs until it is cancelled would
            // never use up its budget. It counts as failed, whatever it gave back.
            Outcome::Returned(Ok(end))
                if matches!(stopped, Stopped::AttemptDeadline | Stopped::Scope)
                    && end.refunds_attempt() =>
            {
                bump(&counters.handler_errors);
                let end = after_failure(&retry, attempt, &why_stopped());
                failed(&end);
                tracing::warn!(then = ?end, "handler gave its run back after its token was cancelled; the attempt counts");
                (end, false)
            }
            // A reason the store would refuse (a NUL, a terminal escape) is escaped, so the
            // run fails as its handler asked instead of staying held.
            Outcome::Returned(Ok(End::Fail(reason)))
                if lease_core::backend::check_reason(&reason).is_err() =>
            {
                (End::Fail(lease_core::sanitize_reason(&reason)), true)
            }
            Outcome::Returned(Ok(end)) => (end, true),
            Outcome::Returned(Err(_)) if stopped == Stopped::Shutdown => {
                // The shutdown's grace ended: not the run's fault. Handed back at once.
                bump(&counters.handler_errors);
                failed(&End::Release);
                tracing::warn!(
                    "handler failed after the shutdown's grace cancelled it; releasing the run"
                );
                (End::Release, false)
            }
            Outcome::Returned(Err(e)) => {
                bump(&counters.handler_errors);
                let why = match stopped {
                    Stopped::No => e.to_string(),
                    _ => format!("{}: {e}", why_stopped()),
                };
                let end = after_failure(&retry, attempt, &why);
                failed(&end);
                tracing::warn!(error = %e, then = ?end, "handler failed");
                (end, false)
            }
            Outcome::Panicked(why) => {
                bump(&counters.handler_errors);
                let end = after_failure(&retry, attempt, &why);
                failed(&end);
                tracing::error!(panic = %why, then = ?end, "handler panicked");
                (end, false)
            }
            Outcome::Stopped if stopped == Stopped::AttemptDeadline => {
                bump(&counters.handler_errors);
                let end = after_failure(
                    &retry,
                    attempt,
                    &format!(
                        "{}; the handler ignored its token and was aborted",
                        why_stopped()
                    ),
                );
                failed(&end);
                tracing::warn!(then = ?end, "handler aborted after its attempt deadline");
                (end, false)
            }
            Outcome::Stopped => {
                bump(&counters.abandoned);
                tracing::warn!("handler outlived the shutdown grace; releasing the run");
                (End::Release, false)
            }
        }
    };
    drop(_slot);
    let effect = effect_slot.and_then(|slot| slot.lock().unwrap_or_else(|e| e.into_inner()).take());
    let effect = match effect {
        // The attempt failed (or was cut short): nothing of it commits.
        Some(_) if !by_handler => {
            tracing::debug!("dropping the effect of an attempt that failed");
            None
        }
        Some(_) if matches!(end, End::Committed(_)) => {
            tracing::warn!("the handler set an effect and ended its lease itself (End::Committed); the effect is dropped");
            None
        }
        other => other,
    };
    if let Some(CancelReason::Rejected(e)) = scope.cancel_reason().map(|(_, r)| r) {
        // The store already said the lease is gone; an end would only be refused again. Not
        // for an end the handler committed itself: a renewal that met it ("ended under your
        // fence") is the very proof, which the batcher's check confirms.
        if !matches!(end, End::Committed(_)) {
            tracing::debug!(%run, %fence, error = %e, "lease lost before its end; not ending it");
            bump(&counters.refused);
            return;
        }
    }
    // Retried until the lease's local deadline: before it, nobody (this worker included)
    // can claim the run again.
    let give_up_at = scope.deadline();
    let ended = scope
        .end_with(reason_of(&end), |lease| {
            submit(
                &ends,
                Ending::new(lease, end),
                effect,
                by_handler,
                give_up_at,
            )
        })
        .await;
    if let Err(Error::EffectFailed { reason, .. }) = ended {
        // Rolled back alone, nothing written, the lease still held: a failed attempt.
        bump(&counters.handler_errors);
        let end = after_failure(&retry, attempt, &format!("effect failed: {reason}"));
        let then = if matches!(end, End::Fail(_)) {
            "fail"
        } else {
            "retry"
        };
        metrics::counter!(observe::WORKER_HANDLER_ERRORS, "outcome" => "effect", "then" => then, "kind" => kind.clone(), "queue" => queue.clone())
            .increment(1);
        tracing::warn!(error = %reason, then = ?end, "effect failed and was rolled back");
        let _ = scope
            .end_with(reason_of(&end), |lease| {
                submit(&ends, Ending::new(lease, end), None, false, give_up_at)
            })
            .await;
    }
}

/// How a scope ends when `end` commits.
fn reason_of(end: &End) -> CancelReason {
    match end.state() {
        lease_core::RunState::Completed => CancelReason::Completed,
        lease_core::RunState::Suspended => CancelReason::Suspended,
        lease_core::RunState::Runnable => CancelReason::Released,
        lease_core::RunState::Failed => CancelReason::Failed,
        lease_core::RunState::Cancelled => CancelReason::Cancelled,
        // A state of a later contract than this worker knows (it sends none): the lease ended
        // all the same, and the run is no longer this worker's.
        _ => CancelReason::Released,
    }
}

/// How a handler's task came out.
enum Outcome {
    /// It returned.
    Returned(std::result::Result<End, lease_core::BoxError>),
    /// It panicked, with this message.
    Panicked(String),
    /// It was stopped: aborted, and not waited for.
    Stopped,
}

/// Aborts `task` and waits up to [`STOP_WAIT`] for it: its result if it ended, `None` if not.
///
/// An abort lands when the task next yields; a handler blocking its thread (a
/// `std::thread::sleep`, a blocking client, a CPU loop) never does, and waiting for it would
/// keep the attempt, its slot, its lease's renewals and the shutdown waiting as long as it
/// blocks. Its thread is left to it; whatever it writes later is refused by the fence.
async fn stop<T>(task: &mut JoinHandle<T>) -> Option<std::result::Result<T, JoinError>> {
    task.abort();
    // A task that yields ends at its next poll; one that blocks its thread does not end
    // within this wait, and is left running.
    tokio::time::timeout(STOP_WAIT, task).await.ok()
}

/// How long a stopped handler's abort is waited for before the handler is taken to block its
/// thread and left to it.
const STOP_WAIT: Duration = Duration::from_millis(100);

/// Completes at `deadline`, or never without one.
async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
