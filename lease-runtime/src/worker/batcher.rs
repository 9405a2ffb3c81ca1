//! The batcher: the ends of many leases committed by one `end_many`.
//!
//! - A batch closes at its size, at [`MAX_BATCH_PAYLOAD_BYTES`] of effects, or after its
//!   delay, whichever comes first; it never holds two ends of one run (the later waits for the
//!   next batch), so the store never refuses a batch the worker built.
//! - One batch is in flight at a time; the ends that arrive during a commit form the next.
//! - A batch that fails without an answer is retried, each end until its lease's local
//!   deadline: until then the store cannot have let anyone, this worker included, claim the
//!   run again, so an end still being retried never meets a new lease of its own run. An
//!   end that answers [`Error::LeaseEnded`] with its own fence and end on a retry was
//!   committed by an earlier attempt.
//! - A batch the store refuses as a whole with an error no retry mends (invalid input,
//!   anything but a retryable failure: never a lease loss) is logged as an error and its ends
//!   are tried again one by one, so one bad end never costs its neighbours their commit.
//! - Once `stop` (the end of the shutdown grace) is cancelled, an attempt in flight is
//!   abandoned and every waiting end gets one last attempt, without further retries: a
//!   shutdown takes at most one more call of the store.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::context::{bump, Counters, EndReport, Observer};
use lease_core::{Effect, End, Ending, Error, LeaseStore, Result, MAX_BATCH_PAYLOAD_BYTES};

/// The least time one attempt is given, whatever its ends' deadlines: a store's own call
/// timeout usually ends it sooner.
const LAST_ATTEMPT: std::time::Duration = std::time::Duration::from_secs(1);

/// An end waiting for its batch.
pub(super) struct Pending {
    ending: Ending,
    /// Applied in the transaction that commits the end ([`LeaseStore::end_many_with_effects`]).
    effect: Option<Effect>,
    by_handler: bool,
    queued: Instant,
    /// When to stop retrying it: its lease's local deadline.
    give_up_at: Instant,
    /// Attempts that failed without an answer: a later `LeaseEnded` with the same fence and
    /// end means one of them committed.
    unanswered: u32,
    /// Sent in a batch of its own: its batch was refused as invalid.
    alone: bool,
    /// Its last attempt after the stop was made.
    last_chance: bool,
    reply: oneshot::Sender<Result<()>>,
}

impl Pending {
    fn payload_len(&self) -> usize {
        match &self.ending.end {
            End::CompleteWith(payload) => payload.len(),
            _ => 0,
        }
    }
}

/// Queues `ending` (with its effect) and waits for its verdict; retried (when unanswered) until `give_up_at`.
pub(super) async fn submit(
    ends: &mpsc::UnboundedSender<Pending>,
    ending: Ending,
    effect: Option<Effect>,
    by_handler: bool,
    give_up_at: Instant,
) -> Result<()> {
    let (reply, answer) = oneshot::channel();
    let pending = Pending {
        ending,
        effect,
        by_handler,
        queued: Instant::now(),
        give_up_at,
        unanswered: 0,
        alone: false,
        last_chance: false,
        reply,
    };
    if ends.send(pending).is_err() {
        return Err(Error::backend("worker", "the batcher stopped"));
    }
    answer
        .await
        .unwrap_or_else(|_| Err(Error::backend("worker", "the batcher dropped an end")))
}

pub(super) struct Batcher {
    pub(super) shared: Arc<Shared>,
    pub(super) rx: mpsc::UnboundedReceiver<Pending>,
    pub(super) size: usize,
    pub(super) delay: std::time::Duration,
}

/// What every attempt needs, shared with the last attempts, which run side by side.
pub(super) struct Shared {
    pub(super) store: Arc<dyn LeaseStore>,
    /// Cancelled when the shutdown's grace ends.
    pub(super) stop: CancellationToken,
    pub(super) counters: Arc<Counters>,
    pub(super) observers: Vec<Observer>,
}

/// Collects ends into batches and commits each with one `end_many` (see the module docs).
pub(super) async fn batcher(mut b: Batcher) {
    let mut queue: VecDeque<Pending> = VecDeque::new();
    let mut open = true;
    let mut retry_pause = std::time::Duration::ZERO;
    // After the stop: the last attempts, side by side, so ends that arrive one by one as
    // their handlers stop do not wait for one another.
    let mut last = tokio::task::JoinSet::new();
    loop {
        if queue.is_empty() {
            if !open {
                break;
            }
            match b.rx.recv().await {
                Some(p) => queue.push_back(p),
                None => break,
            }
        }
        let close_at = queue
            .front()
            .map(|p| p.queued + b.delay)
            .unwrap_or_else(Instant::now);
        while open && queue.len() < b.size {
            match b.rx.try_recv() {
                Ok(p) => {
                    queue.push_back(p);
                    continue;
                }
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
                Err(mpsc::error::TryRecvError::Empty) => {}
            }
            if b.shared.stop.is_cancelled() {
                break; // the shutdown does not wait for a batch to fill
            }
            match tokio::time::timeout_at(close_at, b.rx.recv()).await {
                Ok(Some(p)) => queue.push_back(p),
                Ok(None) => open = false,
                Err(_) => break,
            }
        }
        if b.shared.stop.is_cancelled() {
            while !queue.is_empty() {
                let batch = take_batch(&mut queue, b.size);
                last.spawn(last_attempt(b.shared.clone(), batch));
            }
            continue;
        }
        // The pause is for retries: an end not tried yet goes at once.
        if !retry_pause.is_zero() && queue.iter().all(|p| p.unanswered > 0) {
            // Never past an end's deadline: it is decided then, not at the next attempt.
            let wake = queue
                .iter()
                .filter(|p| p.unanswered > 0)
                .map(|p| p.give_up_at)
                .min()
                .map_or(Instant::now() + retry_pause, |first| {
                    first.min(Instant::now() + retry_pause)
                });
            tokio::select! {
                () = tokio::time::sleep_until(wake) => {}
                () = b.shared.stop.cancelled() => {}
            }
        }
        give_up_late(&b.shared, &mut queue);
        if queue.is_empty() {
            continue;
        }
        let batch = take_batch(&mut queue, b.size);
        let retry = flush(&b.shared, batch).await;
        retry_pause = if retry.is_empty() {
            std::time::Duration::ZERO
        } else {
            (retry_pause * 2).clamp(
                std::time::Duration::from_millis(5),
                std::time::Duration::from_secs(1),
            )
        };
        // Retried ends go first: they are the oldest.
        for p in retry.into_iter().rev() {
            queue.push_front(p);
        }
    }
    while last.join_next().await.is_some() {}
}

/// Decides, as failed, the ends already tried whose deadline passed while they waited for
/// another attempt: from then on the store may let the run be claimed again.
fn give_up_late(shared: &Shared, queue: &mut VecDeque<Pending>) {
    let now = Instant::now();
    let (late, keep): (VecDeque<Pending>, VecDeque<Pending>) = std::mem::take(queue)
        .into_iter()
        .partition(|p| p.unanswered > 0 && p.give_up_at <= now);
    *queue = keep;
    for p in late {
        let why = Error::unavailable(
            "worker",
            "end_many did not answer before the lease's local deadline",
        );
        decided(shared, p, Err(why));
    }
}

/// The last attempt of a batch after the stop; the ends of a batch refused as invalid get
/// theirs one by one. Nothing is retried after it.
async fn last_attempt(shared: Arc<Shared>, batch: Vec<Pending>) {
    for p in flush(&shared, batch).await {
        for q in flush(&shared, vec![p]).await {
            let why = Error::unavailable("worker", "no attempt left after the shutdown's grace");
            decided(&shared, q, Err(why));
        }
    }
}

/// The next batch from the front of `queue`: at most `size` ends, at most
/// [`MAX_BATCH_PAYLOAD_BYTES`] of effects together, one end per run. An end refused as part
/// of an invalid batch goes alone. The ends left out keep their order.
fn take_batch(queue: &mut VecDeque<Pending>, size: usize) -> Vec<Pending> {
    let mut batch: Vec<Pending> = Vec::new();
    let mut runs = HashSet::new();
    let mut bytes = 0usize;
    let mut rest = VecDeque::with_capacity(queue.len());
    while let Some(p) = queue.pop_front() {
        let full = batch.len() >= size || batch.first().is_some_and(|first| first.alone);
        let fits = !full
            && (batch.is_empty() || !p.alone)
            && (batch.is_empty() || bytes + p.payload_len() <= MAX_BATCH_PAYLOAD_BYTES)
            && !runs.contains(p.ending.lease.run());
        if fits {
            bytes += p.payload_len();
            runs.insert(p.ending.lease.run().clone());
            batch.push(p);
        } else {
            rest.push_back(p);
        }
    }
    *queue = rest;
    batch
}

/// Commits one batch; returns the ends to try again.
async fn flush(b: &Shared, batch: Vec<Pending>) -> Vec<Pending> {
    let (checks, writes): (Vec<Pending>, Vec<Pending>) = batch
        .into_iter()
        .partition(|p| matches!(p.ending.end, End::Committed(_)));
    let mut retry = check_committed(b, checks).await;
    retry.extend(flush_writes(b, writes).await);
    retry
}

/// Ends the handlers committed themselves ([`End::Committed`]): nothing is written. One
/// [`renew_many`](LeaseStore::renew_many) of their leases decides them, because a fenced write
/// is answered and confirmed as a fresh write would be: a lease the store reports ended under
/// its own fence, as the handler said ([`Error::LeaseEnded`]), is committed — and that answer,
/// like a retried end's, is confirmed first (replicas, synchronous standbys: a commit the
/// handler's transaction made asynchronously included), so nothing a failover could lose is
/// ever counted. A read would not be confirmed. A lease the store still holds under its fence
/// (the renewal went through) was not ended by that transaction: an error, the lease left to
/// expire. A released or suspended run already claimed again answers a higher fence, which
/// is not held against the handler; a completed run's fence never moves.
async fn check_committed(b: &Shared, checks: Vec<Pending>) -> Vec<Pending> {
    if checks.is_empty() {
        return checks;
    }
    let leases: Vec<lease_core::Lease> = checks.iter().map(|p| p.ending.lease.clone()).collect();
    let deadline = checks
        .iter()
        .map(|p| p.give_up_at)
        .max()
        .unwrap_or_else(Instant::now)
        .max(Instant::now() + LAST_ATTEMPT);
    let probe = tokio::time::timeout_at(deadline, b.store.renew_many(&leases))
        .await
        .unwrap_or_else(|_| Err(Error::unavailable("worker", "renew_many did not answer")));
    let verdicts: Vec<Result<lease_core::Lease>> = match probe {
        Ok(verdicts) if verdicts.len() == checks.len() => verdicts,
        Ok(verdicts) => {
            let e = Error::unavailable(
                "worker",
                format!(
                    "renew_many answered {} of {} leases",
                    verdicts.len(),
                    checks.len()
                ),
            );
            verdicts.iter().map(|_| Err(e.duplicate())).collect()
        }
        Err(e) => checks.iter().map(|_| Err(e.duplicate())).collect(),
    };
    let mut retry = Vec::new();
    for (mut p, verdict) in checks.into_iter().zip(verdicts) {
        let lease = &p.ending.lease;
        let End::Committed(said) = p.ending.end else {
            unreachable!("partitioned on End::Committed")
        };
        let not_so = |shown: String| {
            Err(Error::backend(
                "worker",
                format!(
                    "the handler of run {} reported the lease under fence {} {said} in its own \
                     transaction, but the store shows {shown}: that transaction did not end it \
                     as said",
                    lease.run(),
                    lease.fence(),
                ),
            ))
        };
        let result = match verdict {
            Err(Error::LeaseEnded { fence, ended, .. })
                if fence == lease.fence().get() && ended == said =>
            {
                Ok(())
            }
            Err(Error::LeaseEnded { ended, .. }) => not_so(format!("the lease {ended}")),
            Err(Error::StaleFence { current, .. }) if said != lease_core::Ended::Completed => {
                tracing::debug!(run = %lease.run(), current, "ended, and already claimed again");
                Ok(())
            }
            Ok(_) => not_so("the lease still held (the lease is left to expire)".to_owned()),
            Err(e)
                if e.is_retryable()
                    && !p.last_chance
                    && (Instant::now() < p.give_up_at || b.stop.is_cancelled()) =>
            {
                p.unanswered += 1;
                retry.push(p);
                continue;
            }
            Err(e) => Err(e),
        };
        decided(b, p, result);
    }
    retry
}

/// Commits the ends that are writes with one `end_many`; returns those to try again.
async fn flush_writes(b: &Shared, mut batch: Vec<Pending>) -> Vec<Pending> {
    if batch.is_empty() {
        return batch;
    }
    // The ends (and their effects' payloads) move into the call and back: a payload is never
    // copied on this path.
    let ends: Vec<Ending> = batch
        .iter_mut()
        .map(|p| {
            let end = std::mem::replace(&mut p.ending.end, End::Complete);
            Ending::new(p.ending.lease.clone(), end)
        })
        .collect();
    bump(&b.counters.batches);
    metrics::histogram!(crate::observe::WORKER_BATCH_SIZE).record(batch.len() as f64);
    let stopped = b.stop.is_cancelled();
    if stopped {
        for p in &mut batch {
            p.last_chance = true;
        }
    }
    // Bounded by the latest deadline in the batch (a call stuck on a dead connection is
    // abandoned, and a retry recognises an abandoned call that did commit), and, before the
    // stop, cut short by it: the shutdown then makes its last attempt at once.
    let now = Instant::now();
    let latest = match batch.iter().map(|p| p.give_up_at).max() {
        Some(latest) if latest > now && !stopped => latest,
        // Every end gets an attempt, even one whose deadline passed while it waited.
        _ => now + LAST_ATTEMPT,
    };
    // Effects ride along when there are any; they are kept for a retry (an effect runs again
    // only in a new transaction, after the first one rolled back or was found committed).
    let effects: Vec<Option<Effect>> = batch.iter().map(|p| p.effect.clone()).collect();
    let with_effects = effects.iter().any(Option::is_some);
    let call = tokio::time::timeout_at(latest, async {
        if with_effects {
            b.store.end_many_with_effects(&ends, &effects).await
        } else {
            b.store.end_many(&ends).await
        }
    });
    let answer = tokio::select! {
        answer = call => answer.unwrap_or_else(|_| {
            Err(Error::unavailable("worker", "end_many did not answer before the leases' deadlines"))
        }),
        () = b.stop.cancelled(), if !stopped => {
            Err(Error::unavailable("worker", "end_many abandoned at the end of the shutdown grace"))
        }
    };
    for (p, sent) in batch.iter_mut().zip(ends) {
        p.ending.end = sent.end;
    }
    let results = match answer {
        Ok(results) if results.len() == batch.len() => results,
        Ok(results) => {
            let why = format!(
                "end_many returned {} results for {} ends",
                results.len(),
                batch.len()
            );
            tracing::error!(%why, "malformed batch answer; treating the batch as unanswered");
            let e = Error::unavailable("worker", why);
            batch.iter().map(|_| Err(e.duplicate())).collect()
        }
        Err(e) if !e.is_retryable() && batch.len() > 1 => {
            // The store refused the batch as a whole (an item it cannot take: a bug, or input
            // nobody checked), which is no lease loss and need not be any other item's fate.
            // Nothing was written; each end is tried again on its own, so the neighbours of a
            // bad item commit and the bad one gets its own verdict.
            tracing::error!(error = %e, ends = batch.len(), "end_many refused the whole batch; trying its ends one by one");
            for p in &mut batch {
                p.alone = true;
            }
            return batch;
        }
        Err(e) => {
            tracing::warn!(error = %e, ends = batch.len(), "batch of ends failed");
            batch.iter().map(|_| Err(e.duplicate())).collect()
        }
    };
    let now = Instant::now();
    let mut retry = Vec::new();
    for (mut p, result) in batch.into_iter().zip(results) {
        let result = match result {
            // A retry of an end whose earlier attempt went unanswered: the same fence and the
            // same end mean that attempt committed (only this lease can end the run under it).
            Err(Error::LeaseEnded { fence, ended, .. })
                if p.unanswered > 0
                    && fence == p.ending.lease.fence().get()
                    && p.ending.end.ends_as(ended) =>
            {
                Ok(())
            }
            Err(e)
                if e.is_retryable()
                    && !p.last_chance
                    && (now < p.give_up_at || b.stop.is_cancelled()) =>
            {
                p.unanswered += 1;
                retry.push(p);
                continue;
            }
            other => other,
        };
        decided(b, p, result);
    }
    retry
}

/// Counts, reports and answers one end the store decided.
fn decided(b: &Shared, p: Pending, result: Result<()>) {
    if let Err(Error::EffectFailed { .. }) = &result {
        // Nothing was written and the lease is still held: the job ends it as a failed
        // attempt, which is what gets counted and reported.
        let _ = p.reply.send(result);
        return;
    }
    let c = &b.counters;
    let outcome = match &result {
        Ok(()) => "committed",
        Err(e) if e.is_verdict() => "refused",
        Err(_) => "failed",
    };
    let lease = &p.ending.lease;
    let (kind, queue) = (lease.kind().to_string(), lease.queue().to_string());
    metrics::counter!(crate::observe::WORKER_ENDS, "end" => p.ending.end.as_str(), "outcome" => outcome, "kind" => kind.clone(), "queue" => queue.clone())
        .increment(1);
    match &result {
        Ok(()) => match p.ending.end.state() {
            lease_core::RunState::Completed => {
                bump(&c.completed);
                metrics::histogram!(crate::observe::ATTEMPTS_PER_COMPLETION, "kind" => kind, "queue" => queue)
                    .record(p.ending.lease.attempt() as f64);
            }
            lease_core::RunState::Suspended => bump(&c.suspended),
            lease_core::RunState::Runnable => bump(&c.released),
            lease_core::RunState::Failed | lease_core::RunState::Cancelled => bump(&c.gave_up),
            // A state of a later contract than this worker knows (it sends none): in no count.
            _ => {}
        },
        Err(e) if e.is_verdict() => {
            tracing::warn!(run = %p.ending.lease.run(), fence = %p.ending.lease.fence(), end = p.ending.end.as_str(), error = %e, "end refused: the lease was lost");
            bump(&c.refused);
        }
        Err(e) => {
            tracing::error!(run = %p.ending.lease.run(), fence = %p.ending.lease.fence(), end = p.ending.end.as_str(), error = %e, "end not committed; the lease will expire");
            bump(&c.failed);
        }
    }
    let report = EndReport {
        lease: &p.ending.lease,
        end: &p.ending.end,
        result: &result,
        by_handler: p.by_handler,
    };
    for observer in &b.observers {
        observer(&report);
    }
    let _ = p.reply.send(result);
}

#[cfg(test)]
mod tests {
    use super::*;
    use lease_core::{Lease, RunId, StoreTime, Ttl, WorkerId, MAX_PAYLOAD_BYTES};

    fn pending(run: &str, end: End) -> Pending {
        let lease = Lease::new(
            RunId::new(run).unwrap(),
            WorkerId::new("w").unwrap(),
            lease_core::Fence::new(1).unwrap(),
            Ttl::from_secs(30).unwrap(),
            StoreTime::from_micros(0),
        )
        .unwrap();
        Pending {
            ending: Ending::new(lease, end),
            effect: None,
            by_handler: true,
            queued: Instant::now(),
            give_up_at: Instant::now(),
            unanswered: 0,
            alone: false,
            last_chance: false,
            reply: oneshot::channel().0,
        }
    }

    fn runs(batch: &[Pending]) -> Vec<&str> {
        batch
            .iter()
            .map(|p| p.ending.lease.run().as_str())
            .collect()
    }

    #[test]
    fn a_batch_is_cut_by_effect_bytes_and_never_holds_one_run_twice() {
        let big = || End::CompleteWith(vec![0; MAX_PAYLOAD_BYTES]);
        let mut queue: VecDeque<Pending> =
            (0..70).map(|i| pending(&format!("r{i}"), big())).collect();
        let first = take_batch(&mut queue, 100);
        assert_eq!(first.len(), MAX_BATCH_PAYLOAD_BYTES / MAX_PAYLOAD_BYTES);
        let ends: Vec<Ending> = first
            .iter()
            .map(|p| Ending::new(p.ending.lease.clone(), p.ending.end.clone()))
            .collect();
        lease_core::backend::check_end_batch(&ends).expect("a batch the store accepts");
        assert_eq!(queue.len(), 70 - first.len());
        assert_eq!(
            queue.front().map(|p| p.ending.lease.run().as_str()),
            Some("r64")
        );

        let mut queue: VecDeque<Pending> = ["a", "b", "a", "c", "a"]
            .iter()
            .map(|r| pending(r, End::Complete))
            .collect();
        assert_eq!(runs(&take_batch(&mut queue, 100)), ["a", "b", "c"]);
        assert_eq!(runs(&take_batch(&mut queue, 100)), ["a"]);
        assert_eq!(runs(&take_batch(&mut queue, 100)), ["a"]);
        assert!(queue.is_empty());
    }

    #[test]
    fn an_end_refused_in_an_invalid_batch_goes_alone() {
        let mut queue: VecDeque<Pending> = ["a", "b", "c"]
            .iter()
            .map(|r| pending(r, End::Complete))
            .collect();
        for p in &mut queue {
            p.alone = true;
        }
        queue.push_back(pending("d", End::Complete));
        assert_eq!(runs(&take_batch(&mut queue, 100)), ["a"]);
        assert_eq!(runs(&take_batch(&mut queue, 100)), ["b"]);
        assert_eq!(runs(&take_batch(&mut queue, 100)), ["c"]);
        assert_eq!(runs(&take_batch(&mut queue, 100)), ["d"]);
    }
}
