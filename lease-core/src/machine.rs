//! The run's state machine: every transition of the contract written once, as a function of a
//! record, an operation and the store's clock, with no I/O and no clock of its own.
//!
//! [`step`] holds the rules: which claims are refused and why, what a claim takes over (the
//! expired attempt archived, the fence raised, the budget counted), what a renewal extends,
//! what every [`End`] does (its attempt archived, the refund of a voluntary end, the failure
//! reason, the retry delay), force-release, cancel and resume; [`Run::claim_order`] is the
//! order `claim_next` takes runs in, [`Run::purgeable`] what retention may delete.
//!
//! How each backend follows it (see `ARCHITECTURE.md`, "The state machine"):
//! - the memory store **is** a map of [`Run`]s driven by [`step`];
//! - etcd reads a record, presents it as its timer judges it (an expiry etcd has reached is
//!   in the past, one it has not is in the future, whatever this host's clock says), applies
//!   [`step`], and writes the result under a compare of the revision it read;
//! - Postgres (SQL) and Redis (Lua) apply the same transitions inside the server, where a
//!   write must happen to be atomic; `lease-conformance`'s machine table drives every backend
//!   through the same transitions and compares each verdict and record with [`step`]'s.
//!
//! ```
//! use lease_core::machine::{step, Applied, Op, Run};
//! use lease_core::{End, Kind, RunId, RunState, StoreTime, Ttl, WorkerId};
//!
//! let id = RunId::new("order-42")?;
//! let t = |ms: u64| StoreTime::from_micros(ms * 1000);
//! let mut run = Run::created(Kind::default(), 0, Default::default(), t(0), t(0));
//! let worker = WorkerId::new("w1")?;
//! let ttl = Ttl::from_secs(30)?;
//! step(&id, &mut run, Op::Claim { worker: &worker, ttl }, t(5))?;
//! assert_eq!(run.fence.get(), 1);
//! let lease = run.lease(&id, ttl).expect("held");
//! // A second claim is refused while the lease lives, and changes nothing.
//! let other = WorkerId::new("w2")?;
//! assert!(step(&id, &mut run, Op::Claim { worker: &other, ttl }, t(6)).is_err());
//! let ended = step(&id, &mut run, Op::End { lease: &lease, end: &End::Release }, t(7))?;
//! assert_eq!(ended, Applied::Ended { journal: None });
//! assert_eq!((run.state, run.attempts), (RunState::Runnable, 0)); // a release gives it back
//! # Ok::<(), lease_core::Error>(())
//! ```

use std::cmp::Reverse;
use std::collections::VecDeque;
use std::time::Duration;

use crate::backend::{claim_refusal, fenced_verdict};
use crate::signal::{signal_verdict, Delivery, Waiting};
use crate::{
    attempt_error, Attempt, AttemptOutcome, End, EndedStates, Error, Fence, InvalidInput, Kind,
    Lease, Result, RunId, RunRecord, RunState, Signal, SignalName, StoreTime, Ttl, Wait, WaitEnd,
    WorkerId,
};

/// What the rules read and write of one run: the record every backend keeps, in the store's
/// time ([`StoreTime`], microseconds of the store's clock). The journal, the payload and the
/// idempotency keys are the backend's own: the machine says when they may be written.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Run {
    /// Its state.
    pub state: RunState,
    /// Its fence: that of its latest claim (the floor it was created at before one).
    pub fence: Fence,
    /// The holder of its lease, live or expired; `None` when unowned.
    pub owner: Option<WorkerId>,
    /// When the lease expires (or expired), exactly while owned.
    pub expires_at: Option<StoreTime>,
    /// While owned, the expiry; while runnable and unowned, when it became (or becomes, after
    /// a delay) claimable; once ended, when it ended (retention's age).
    pub claimable_at: StoreTime,
    /// The attempt budget's counter: claims since create or resume, less voluntary ends.
    pub attempts: u64,
    /// Renewals of the current lease's life (never reset: a count of renewals).
    pub heartbeats: u64,
    /// A failed or cancelled run's reason.
    pub failure: Option<String>,
    /// Its kind.
    pub kind: Kind,
    /// Its priority.
    pub priority: u8,
    /// Its queue (the default until [`Run::in_queue`] sets another).
    pub queue: crate::Queue,
    /// When it was created.
    pub created_at: StoreTime,
    /// When its latest claim took it.
    pub claimed_at: Option<StoreTime>,
    /// When its latest claim's lease was last renewed.
    pub renewed_at: Option<StoreTime>,
    /// Its ended attempts, oldest first, at most [`MAX_HISTORY`](crate::MAX_HISTORY).
    pub history: VecDeque<Attempt>,
    /// While suspended by [`End::AwaitSignal`]: what it waits for.
    pub wait: Option<Wait>,
    /// How its last wait ended, until it waits again.
    pub resumed: Option<WaitEnd>,
}

/// One operation on a run that exists (create and purge add and remove records; they are the
/// backend's, with [`Run::created`] and [`Run::purgeable`]).
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum Op<'a> {
    /// A claim by `worker` for `ttl`.
    Claim {
        /// The claimant.
        worker: &'a WorkerId,
        /// The lease's time to live, as the store times it.
        ttl: Ttl,
    },
    /// A renewal of `lease` for `ttl` (the lease's own, or as the store rounds it).
    Renew {
        /// The lease presented.
        lease: &'a Lease,
        /// The new time to live.
        ttl: Ttl,
    },
    /// A fenced write that leaves the run as it is (a journal append): the verdict only.
    Write {
        /// The lease presented.
        lease: &'a Lease,
    },
    /// The end of `lease` as `end` says.
    End {
        /// The lease presented.
        lease: &'a Lease,
        /// How it ends ([`End::Committed`] is refused: it names an end already written).
        end: &'a End,
    },
    /// An operator's force-release.
    ForceRelease,
    /// A cancel with `reason` (already checked).
    Cancel {
        /// Why.
        reason: &'a str,
    },
    /// A resume of a suspended or failed run.
    Resume,
    /// A signal for the wait of `fence` (a [`SignalToken`](crate::SignalToken)'s, already
    /// verified), with `payload` (already checked).
    Signal {
        /// The signal's name.
        name: &'a SignalName,
        /// The fence of the wait it answers.
        fence: Fence,
        /// What it delivers.
        payload: &'a [u8],
    },
}

/// What [`step`] did, when it did not refuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Applied<'a> {
    /// Claimed, after the run had been claimable this long.
    Claimed {
        /// Since the expiry of the lease before, or since the run became claimable.
        waited: Duration,
    },
    /// Renewed.
    Renewed,
    /// The lease may write.
    Writable,
    /// Ended; `journal` is the entry the backend appends under the lease's fence in the same
    /// write ([`End::CompleteWith`]'s).
    Ended {
        /// The entry to journal with the end.
        journal: Option<&'a [u8]>,
    },
    /// Force-released.
    ForceReleased,
    /// Cancelled now.
    Cancelled,
    /// It was cancelled already: nothing changed (a cancel is idempotent).
    AlreadyCancelled,
    /// Resumed.
    Resumed,
    /// Signalled: the run is claimable, with the signal for its next leases; `duplicate` when
    /// this delivery had been made before and nothing changed.
    Signalled {
        /// Whether it had been delivered before.
        duplicate: bool,
    },
}

impl Run {
    /// A run as create leaves it: runnable, unowned, at fence `floor` (the highest fence of
    /// any purged run), claimable from `claimable_at` (its delay or start time; `now` for
    /// none), created `now`.
    pub fn created(
        kind: Kind,
        priority: u8,
        floor: Fence,
        now: StoreTime,
        claimable_at: StoreTime,
    ) -> Run {
        Run {
            state: RunState::Runnable,
            fence: floor,
            owner: None,
            expires_at: None,
            claimable_at,
            attempts: 0,
            heartbeats: 0,
            failure: None,
            kind,
            priority,
            queue: crate::Queue::default(),
            created_at: now,
            claimed_at: None,
            renewed_at: None,
            history: VecDeque::new(),
            wait: None,
            resumed: None,
        }
    }

    /// Whether it waits for a signal whose deadline has passed at `now`: the next claim takes
    /// it, and a signal is refused.
    pub fn wait_timed_out(&self, now: StoreTime) -> bool {
        self.state == RunState::Suspended && self.wait.as_ref().is_some_and(|w| w.timed_out(now))
    }

    /// Whether it ended: completed, failed or cancelled.
    pub fn is_ended(&self) -> bool {
        matches!(
            self.state,
            RunState::Completed | RunState::Failed | RunState::Cancelled
        )
    }

    /// Whether it is runnable, unowned and claimable at `now` (`claim_next` takes it).
    pub fn is_due(&self, now: StoreTime) -> bool {
        self.state == RunState::Runnable
            && self.owner.is_none()
            && self.claimable_at <= now
            && self.fence < Fence::MAX
    }

    /// Whether `claim_next` may take it at `now`: due, or held by a lease expired by then.
    pub fn is_claimable(&self, now: StoreTime) -> bool {
        (self.state == RunState::Runnable || self.wait_timed_out(now))
            && self.claimable_at <= now
            && self.fence < Fence::MAX
    }

    /// The order `claim_next` takes claimable runs in: the highest priority first, then the
    /// longest claimable (the caller breaks ties by creation).
    pub fn claim_order(&self) -> (Reverse<u8>, StoreTime) {
        (Reverse(self.priority), self.claimable_at)
    }

    /// Whether retention may delete it at `now`: ended in one of `states`, at least
    /// `older_than` ago.
    pub fn purgeable(&self, states: EndedStates, older_than: Duration, now: StoreTime) -> bool {
        self.is_ended()
            && states.contains(self.state)
            && now.saturating_since(self.claimable_at) >= older_than
    }

    /// How long before an unowned runnable run given back with a delay is claimable; `None`
    /// when it is (or in any other state).
    pub fn delay(&self, now: StoreTime) -> Option<Duration> {
        (self.state == RunState::Runnable && self.owner.is_none() && self.claimable_at > now)
            .then(|| self.claimable_at.saturating_since(now))
    }

    /// The same run, in `queue`: as create leaves a run created with one.
    #[must_use]
    pub fn in_queue(mut self, queue: crate::Queue) -> Run {
        self.queue = queue;
        self
    }

    /// The lease its holder has, for `ttl` (without payload or waiting time: the backend's).
    pub fn lease(&self, run: &RunId, ttl: Ttl) -> Option<Lease> {
        let (owner, expires_at) = (self.owner.clone()?, self.expires_at?);
        Some(
            Lease::new(run.clone(), owner, self.fence, ttl, expires_at)
                .ok()?
                .with_attempt(self.attempts)
                .with_kind(self.kind.clone())
                .with_queue(self.queue.clone())
                .with_priority(self.priority)
                .with_resumed(self.resumed.clone()),
        )
    }

    /// The record `inspect` reports at `now` (without payload and history: the caller adds
    /// them where the operation reports them).
    pub fn record(&self, run: &RunId, now: StoreTime) -> RunRecord {
        let mut record = RunRecord::new(run.clone(), self.state, self.fence, now);
        record.owner = self.owner.clone();
        record.expires_at = self.expires_at;
        record.heartbeats = self.heartbeats;
        record.not_before = self.delay(now).map(|_| self.claimable_at);
        record.failure = self.failure.clone();
        record.attempts = self.attempts;
        record.kind = self.kind.clone();
        record.queue = self.queue.clone();
        record.priority = self.priority;
        record.created_at = Some(self.created_at);
        record.claimed_at = self.claimed_at;
        record.renewed_at = self.renewed_at;
        record.ended_at = self.is_ended().then_some(self.claimable_at);
        record.claimable_since =
            (self.state == RunState::Runnable && self.owner.is_none() && self.claimable_at <= now)
                .then_some(self.claimable_at);
        record.wait = self.wait.clone();
        record.resumed = self.resumed.clone();
        record
    }

    /// The fenced-write verdict on `lease` (see [`fenced_verdict`]).
    pub fn check_write(&self, run: &RunId, lease: &Lease) -> Result<()> {
        fenced_verdict(
            run,
            lease.fence(),
            self.fence,
            self.state,
            self.owner.is_some(),
        )
    }

    /// Writes the held lease's attempt into the history as `outcome` ended `now`, or as
    /// expired at its expiry if it had expired by then: a force-release, a cancel or a claim
    /// after the expiry did not end the attempt, the expiry did.
    fn archive(&mut self, outcome: AttemptOutcome, error: Option<&str>, now: StoreTime) {
        match self.expires_at {
            Some(at) if at <= now => self.push_attempt(AttemptOutcome::Expired, None, at),
            Some(_) => self.push_attempt(outcome, error, now),
            None => {}
        }
    }

    /// Writes the lease's attempt (its number, fence, holder and claim) into the history,
    /// ended at `ended`, the oldest dropped past [`MAX_HISTORY`](crate::MAX_HISTORY). Before
    /// the owner is cleared or the attempt refunded; nothing for an unowned run.
    fn push_attempt(&mut self, outcome: AttemptOutcome, error: Option<&str>, ended: StoreTime) {
        let Some(worker) = self.owner.clone() else {
            return;
        };
        let attempt = Attempt::new(self.attempts, self.fence, worker, outcome)
            .with_times(self.claimed_at, Some(ended))
            .with_error(error.map(|e| attempt_error(e).to_owned()));
        while self.history.len() >= crate::MAX_HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(attempt);
    }

    /// Leaves it unowned as of `now` (claimable from then if runnable; when it ended, if
    /// ended).
    fn unown(&mut self, now: StoreTime) {
        self.owner = None;
        self.expires_at = None;
        self.claimable_at = now;
    }
}

/// Applies `op` to `run` (the record of `id`) at the store's `now`: the run changed as the
/// contract says and what was done, or the contract's refusal with the run unchanged.
///
/// # Errors
/// The claim refusals ([`Error::Held`], [`Error::Delayed`], [`Error::Suspended`],
/// [`Error::Completed`], [`Error::Failed`], [`Error::Cancelled`],
/// [`Error::FenceExhausted`]), the fenced-write verdicts ([`Error::StaleFence`],
/// [`Error::FenceAhead`], [`Error::LeaseEnded`]), [`Error::NotSuspended`] for a resume,
/// and [`InvalidInput::Unsupported`] for an [`End::Committed`] or a state of a later
/// contract.
pub fn step<'a>(id: &RunId, run: &mut Run, op: Op<'a>, now: StoreTime) -> Result<Applied<'a>> {
    match op {
        Op::Claim { worker, ttl } => {
            let remaining = run.expires_at.map(|at| at.saturating_since(now));
            // A wait past its deadline is claimable: the claim resumes it as timed out.
            let timed_out = run.wait_timed_out(now);
            if let Some(refusal) = claim_refusal(
                id,
                if timed_out {
                    RunState::Runnable
                } else {
                    run.state
                },
                run.owner.as_ref(),
                remaining,
                run.delay(now),
                run.fence,
            ) {
                return Err(refusal);
            }
            if timed_out {
                let wait = run.wait.take().expect("timed out");
                run.resumed = Some(WaitEnd::TimedOut {
                    name: wait.name,
                    fence: wait.fence,
                    at: wait.deadline.expect("timed out"),
                });
                run.state = RunState::Runnable;
                // A wait's time does not spend the budget: the resumed run starts afresh.
                run.attempts = 0;
            }
            // Claimable since the expiry of the lease before, or since claimable_at.
            let since = run.expires_at.unwrap_or(run.claimable_at);
            // An expired lease taken over: its attempt ended at its expiry.
            run.archive(AttemptOutcome::Expired, None, now);
            run.fence = Fence::new(run.fence.get() + 1)?;
            // Every claim counts; a voluntary end gives it back.
            run.attempts += 1;
            run.owner = Some(worker.clone());
            let expires_at = after(now, ttl.as_duration());
            run.expires_at = Some(expires_at);
            run.claimable_at = expires_at;
            run.claimed_at = Some(now);
            run.renewed_at = None;
            Ok(Applied::Claimed {
                waited: now.saturating_since(since),
            })
        }
        Op::Renew { lease, ttl } => {
            run.check_write(id, lease)?;
            let expires_at = after(now, ttl.as_duration());
            run.expires_at = Some(expires_at);
            run.claimable_at = expires_at;
            run.renewed_at = Some(now);
            run.heartbeats += 1;
            Ok(Applied::Renewed)
        }
        Op::Write { lease } => {
            run.check_write(id, lease)?;
            Ok(Applied::Writable)
        }
        Op::End { lease, end } => {
            let Some((outcome, error)) = AttemptOutcome::of_end(end) else {
                return Err(InvalidInput::Unsupported {
                    operation: "ending a lease as already committed",
                }
                .into());
            };
            run.check_write(id, lease)?;
            // The fence accepted the end, expired or not: it is what ended the attempt.
            run.push_attempt(outcome, error, now);
            if end.refunds_attempt() {
                run.attempts = run.attempts.saturating_sub(1);
            }
            let journal = match end {
                End::CompleteWith(payload) => Some(payload.as_slice()),
                End::Fail(reason) => {
                    run.failure = Some(reason.clone());
                    None
                }
                _ => None,
            };
            run.state = end.state();
            run.owner = None;
            run.expires_at = None;
            run.claimable_at = after(now, Duration::from_millis(end.delay_millis()));
            if let End::AwaitSignal { name, timeout } = end {
                if answered_early(run, name) {
                    // The signal came while the lease ran: the wait is over as it begins.
                    run.state = RunState::Runnable;
                    run.attempts = 0;
                } else {
                    let deadline = timeout.map(|t| after(now, t));
                    run.wait = Some(Wait::new(name.clone(), deadline, run.fence));
                    // The last wait's answer is the handler's no more once it waits again.
                    run.resumed = None;
                    // A timed-out wait is claimable from its deadline, in the claim order.
                    run.claimable_at = deadline.unwrap_or(now);
                }
            }
            Ok(Applied::Ended { journal })
        }
        Op::ForceRelease => {
            match run.state {
                RunState::Runnable => {}
                state => return Err(refused_in(id, state, "force_release")),
            }
            run.archive(AttemptOutcome::ForceReleased, None, now);
            run.unown(now);
            Ok(Applied::ForceReleased)
        }
        Op::Cancel { reason } => match run.state {
            RunState::Cancelled => Ok(Applied::AlreadyCancelled),
            RunState::Runnable | RunState::Suspended | RunState::Failed => {
                run.archive(AttemptOutcome::Cancelled, Some(reason), now);
                run.state = RunState::Cancelled;
                run.wait = None;
                run.failure = Some(reason.to_owned());
                run.unown(now);
                Ok(Applied::Cancelled)
            }
            state => Err(refused_in(id, state, "cancel")),
        },
        Op::Resume => {
            if !matches!(run.state, RunState::Suspended | RunState::Failed) {
                return Err(Error::NotSuspended {
                    run: id.clone(),
                    state: run.state,
                });
            }
            run.state = RunState::Runnable;
            run.failure = None;
            // An operator's resume ends a wait with no answer.
            run.wait = None;
            // A fresh budget.
            run.attempts = 0;
            run.claimable_at = now;
            Ok(Applied::Resumed)
        }
        Op::Signal {
            name,
            fence,
            payload,
        } => {
            let waiting = Waiting {
                state: run.state,
                fence: run.fence,
                owned: run.owner.is_some(),
                wait: run.wait.as_ref(),
                resumed: run.resumed.as_ref(),
            };
            let delivery = signal_verdict(id, waiting, name, fence, payload, now)?;
            if delivery != Delivery::Duplicate {
                let signal = Signal::new(name.clone(), fence, now, payload);
                run.resumed = Some(WaitEnd::Signalled(signal));
            }
            if delivery == Delivery::Deliver {
                run.wait = None;
                run.state = RunState::Runnable;
                // A wait's time does not spend the budget: the resumed run starts afresh.
                run.attempts = 0;
                run.claimable_at = now;
            }
            Ok(Applied::Signalled {
                duplicate: delivery == Delivery::Duplicate,
            })
        }
    }
}

/// [`step`] as a pure function: the run after `op` and what was done, `run` untouched.
///
/// # Errors
/// As [`step`].
pub fn apply<'a>(id: &RunId, run: &Run, op: Op<'a>, now: StoreTime) -> Result<(Run, Applied<'a>)> {
    let mut next = run.clone();
    let applied = step(id, &mut next, op, now)?;
    Ok((next, applied))
}

/// Why an operator's operation is refused in `state`: named by the state, or unsupported for
/// a state of a later contract (refused, not guessed at).
fn refused_in(id: &RunId, state: RunState, operation: &'static str) -> Error {
    let run = id.clone();
    match state {
        RunState::Suspended => Error::Suspended { run },
        RunState::Completed => Error::Completed { run },
        RunState::Failed => Error::Failed { run },
        RunState::Cancelled => Error::Cancelled { run },
        RunState::Runnable => InvalidInput::Unsupported { operation }.into(),
    }
}

/// Whether `run`'s holding lease (its fence) was answered early with a signal for `name`
/// ([`Delivery::Early`](crate::signal::Delivery::Early)).
fn answered_early(run: &Run, name: &SignalName) -> bool {
    matches!(&run.resumed, Some(WaitEnd::Signalled(s)) if s.fence == run.fence && &s.name == name)
}

/// `at` plus `span`, in the store's microseconds.
fn after(at: StoreTime, span: Duration) -> StoreTime {
    StoreTime::from_micros(at.as_micros().saturating_add(span.as_micros() as u64))
}

#[cfg(test)]
mod tests;
