//! The lease-and-fence protocol as a model, checked over every interleaving with
//! [stateright](https://docs.rs/stateright).
//!
//! One run, one store, and [`LeaseModel::workers`] workers that talk to the store over a
//! network that **delays, drops, duplicates and reorders** every message. Time is a global
//! tick: the store judges expiry on it (the store's clock), and each worker keeps its local
//! deadline on it (a monotonic clock that runs at the same rate; clock *skew* between the store
//! and the workers is outside this model, see the crate README of `lease-core`). A worker that
//! is paused (GC, SIGSTOP) or partitioned is modelled by the scheduler simply not running it
//! while time passes and its messages sit in the network: every such schedule is one of the
//! interleavings explored.
//!
//! Workers claim, renew (the heartbeat), write under their fence, suspend and complete; an
//! operator resumes a suspended run, and (in [`LeaseModel::cancel`]) may cancel the run at any
//! point, held or not. The store follows the `LeaseStore` contract: a claim succeeds on a
//! runnable run that is unowned or expired and takes the next fence; every fenced operation is
//! accepted iff the presented fence equals the current one and the lease is held. A worker
//! computes its local deadline from the instant it **sent** the claim or renewal that
//! succeeded, plus the TTL, minus a margin, and stops working when it passes.
//!
//! The properties ([`LeaseModel::properties`]) are checked in every reachable state. A
//! [`Flaw`] breaks the protocol on purpose, to show the checker finds what each property
//! guards against.
//!
//! ```
//! use lease_model::LeaseModel;
//! use stateright::{Checker, Model};
//! let checker = LeaseModel::small().checker().spawn_bfs().join();
//! checker.assert_properties();
//! assert!(checker.unique_state_count() > 1_000);
//! ```

mod state;

pub use state::*;
use stateright::{Model, Property};

/// A deliberate break of the protocol, for showing that the checker finds each failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Flaw {
    /// The store accepts a fenced write whose fence is lower than or equal to the current one
    /// (`presented <= current`) instead of equal.
    AcceptLowerFence,
    /// The store renews a lease by fence alone, even when the run is suspended.
    RenewSuspended,
    /// The store keeps a fence per worker instead of per run.
    PerWorkerFence,
    /// The worker takes its local deadline from the instant a reply **arrived** instead of the
    /// instant its request was sent.
    DeadlineFromReceipt,
    /// The store lets a claim take a run given back with a retry delay before the delay ends.
    ClaimIgnoresDelay,
    /// The worker checks the attempt budget only when a handler returns an error, never at
    /// claim time: a handler that crashes (its lease just expires) runs for ever.
    BudgetOnlyOnError,
    /// A cancel marks the run but leaves a held lease as it is (a cancel flag beside the
    /// lease, as a hand-built job layer has), so the holder's fenced writes still land.
    CancelKeepsHolder,
}

/// The protocol and its bounds.
#[derive(Clone, Debug)]
pub struct LeaseModel {
    /// How many workers compete for the run.
    pub workers: u8,
    /// The lease TTL, in ticks.
    pub ttl: u8,
    /// The worker's safety margin: its local deadline is `sent + ttl - margin`.
    pub margin: u8,
    /// The last tick explored.
    pub max_time: u8,
    /// The most messages in flight at once (new requests and copies wait for room).
    pub max_in_flight: usize,
    /// How many claims each worker may send.
    pub claims_per_worker: u8,
    /// How many fenced writes each worker may send.
    pub writes_per_worker: u8,
    /// A deliberate break, or `None` for the protocol as designed.
    pub flaw: Option<Flaw>,
    /// Whether workers may also end a lease with a retry delay or fail the run (and an
    /// operator resume a failed run): the rest of a run's life.
    pub life: bool,
    /// The retry delay, in ticks, when `life` is on.
    pub retry_delay: u8,
    /// The attempt budget, when modelled: every claim counts, a voluntary release gives its
    /// attempt back, a crash (a lease left to expire) keeps it; a worker fails a run it claims
    /// past the budget without running it. Workers may then release voluntarily.
    pub max_attempts: Option<u8>,
    /// Whether an operator may cancel the run (once), whatever state it is in but completed.
    pub cancel: bool,
}

impl LeaseModel {
    /// Two workers, TTL 3, margin 1, ticks 0 to 4, two messages in flight, one claim and one
    /// write per worker: 7.6 million distinct states (32 million visits, paths up to 46 steps),
    /// explored exhaustively in about half a minute, and large enough for every failure a
    /// [`Flaw`] causes: an expiry and a reclaim, a suspend, a resume and a reclaim, a delayed,
    /// lost or duplicated message at every step.
    pub fn small() -> LeaseModel {
        LeaseModel {
            workers: 2,
            ttl: 3,
            margin: 1,
            max_time: 4,
            max_in_flight: 2,
            claims_per_worker: 1,
            writes_per_worker: 1,
            flaw: None,
            life: false,
            retry_delay: 1,
            max_attempts: None,
            cancel: false,
        }
    }

    /// The small model with an operator who may cancel the run once, at any point: while it
    /// waits, while a worker holds it, after a suspend. Ticks 0 to 3 (a lease is not reclaimed
    /// after expiry here: the small model checks that), about the small model's size. Checks
    /// that nothing under a fence is accepted after the cancel and that a cancelled run is
    /// never claimed.
    pub fn cancel() -> LeaseModel {
        LeaseModel {
            cancel: true,
            max_time: 3,
            ..LeaseModel::small()
        }
    }

    /// The attempt budget (2 attempts): two workers whose handlers crash (their leases expire
    /// unended) or give their run back voluntarily, up to two claims each, TTL 2, ticks 0 to 5,
    /// one message in flight at a time (still delayed, lost or duplicated), no fenced writes,
    /// no suspend or completion: about 335,000 states. (Two in flight: 42 million, 5 minutes.) Checks that no run is worked on more than its budget allows and that
    /// a run whose attempts vanish is failed by the claim past them.
    pub fn budget() -> LeaseModel {
        LeaseModel {
            ttl: 2,
            max_time: 5,
            max_in_flight: 1,
            claims_per_worker: 2,
            writes_per_worker: 0,
            max_attempts: Some(2),
            ..LeaseModel::small()
        }
    }

    /// The small model with the rest of a run's life: a worker may also give its run back with
    /// a retry delay of one tick or fail it, and an operator may resume a failed run. Fenced
    /// writes are left out (the small model checks them) to keep the state space near the
    /// small model's.
    pub fn life() -> LeaseModel {
        LeaseModel {
            life: true,
            writes_per_worker: 0,
            ..LeaseModel::small()
        }
    }

    /// The same model with `flaw`.
    pub fn with_flaw(mut self, flaw: Flaw) -> LeaseModel {
        self.flaw = Some(flaw);
        self
    }

    fn has(&self, flaw: Flaw) -> bool {
        self.flaw == Some(flaw)
    }

    fn deadline(&self, sent: u8, now: u8) -> u8 {
        let from = if self.has(Flaw::DeadlineFromReceipt) {
            now
        } else {
            sent
        };
        from + self.ttl - self.margin
    }
}

impl LeaseModel {
    fn send(&self, state: &mut State, from: u8, op: Op) {
        let sent = state.now;
        state.net.push(Packet {
            msg: Msg::Request { from, sent, op },
            copy: false,
        });
        state.net.sort();
    }

    fn held(&self, store: &Store, fence: u8) -> bool {
        let fence_ok = if self.has(Flaw::AcceptLowerFence) {
            fence <= store.fence
        } else {
            fence == store.fence
        };
        fence_ok && store.phase == Phase::Runnable && store.owner.is_some()
    }

    /// The store applies a request at its clock `now` and answers; the history notes what it
    /// accepted or refused after a cancel.
    fn apply(&self, state: &mut State, from: u8, op: Op) -> Answer {
        let answer = self.decide(state, from, op);
        let history = &mut state.history;
        if history.cancelled {
            match (op, answer) {
                (Op::Claim(_), Answer::Granted(..)) => history.claimed_after_cancel = true,
                (Op::Claim(_), _) => {}
                (_, Answer::Accepted) => history.accepted_after_cancel = true,
                (_, _) => history.holder_refused_after_cancel = true,
            }
        }
        answer
    }

    /// The store's rules for a request at its clock `now`.
    fn decide(&self, state: &mut State, from: u8, op: Op) -> Answer {
        let now = state.now;
        let store = &mut state.store;
        let history = &mut state.history;
        match op {
            Op::Claim(_) => {
                let free = store.owner.is_none() || store.expires <= now;
                let delayed = store.owner.is_none()
                    && now < store.not_before
                    && !self.has(Flaw::ClaimIgnoresDelay);
                if store.phase != Phase::Runnable || !free || delayed {
                    return Answer::Refused;
                }
                // What the properties watch, judged apart from the rule above.
                history.claimed_in_delay |= store.owner.is_none() && now < store.not_before;
                history.retried |= store.not_before > 0 && store.owner.is_none();
                history.claimed_after_failure |= history.failed;
                let fence = if self.has(Flaw::PerWorkerFence) {
                    store.per_worker[usize::from(from)] += 1;
                    store.per_worker[usize::from(from)]
                } else {
                    store.fence + 1
                };
                store.fence = fence;
                store.owner = Some(from);
                store.expires = now + self.ttl;
                store.not_before = 0;
                store.attempts += 1;
                if fence <= history.granted_max {
                    history.fence_repeated = true;
                }
                history.granted_max = history.granted_max.max(fence);
                history.claimed_after_resume |= history.resumed;
                Answer::Granted(fence, store.attempts)
            }
            Op::Renew(fence) => {
                let ok = if self.has(Flaw::RenewSuspended) {
                    fence == store.fence && store.phase != Phase::Completed
                } else {
                    self.held(store, fence)
                };
                if !ok {
                    return Answer::Refused;
                }
                if store.phase == Phase::Suspended {
                    history.renewed_suspended = true;
                }
                store.expires = now + self.ttl;
                Answer::Accepted
            }
            Op::Write(fence) => {
                if !self.held(store, fence) {
                    if fence < store.fence {
                        history.stale_refused = true;
                    }
                    return Answer::Refused;
                }
                if fence < history.written_max {
                    history.stale_after_newer = true;
                }
                history.written_max = history.written_max.max(fence);
                let slot = usize::from(fence);
                if history.writer_of.len() <= slot {
                    history.writer_of.resize(slot + 1, None);
                }
                match history.writer_of[slot] {
                    Some(writer) if writer != from => history.shared_fence = true,
                    _ => history.writer_of[slot] = Some(from),
                }
                Answer::Accepted
            }
            Op::Suspend(fence) | Op::Complete(fence) => {
                if !self.held(store, fence) {
                    return Answer::Refused;
                }
                store.owner = None;
                if matches!(op, Op::Complete(_)) {
                    store.phase = Phase::Completed;
                    history.completes += 1;
                } else {
                    store.phase = Phase::Suspended;
                }
                Answer::Accepted
            }
            Op::Retry(fence) | Op::Fail(fence) => {
                if !self.held(store, fence) {
                    return Answer::Refused;
                }
                store.owner = None;
                if matches!(op, Op::Fail(_)) {
                    store.phase = Phase::Failed;
                    history.failed = true;
                } else {
                    store.not_before = now + self.retry_delay;
                }
                Answer::Accepted
            }
            Op::Release(fence) => {
                if !self.held(store, fence) {
                    return Answer::Refused;
                }
                store.owner = None;
                store.attempts = store.attempts.saturating_sub(1);
                history.refunded += 1;
                Answer::Accepted
            }
        }
    }

    /// A worker takes in a reply.
    fn receive(&self, state: &mut State, to: u8, sent: u8, op: Op, answer: Answer) {
        let now = state.now;
        let deadline = self.deadline(sent, now);
        let worker = &mut state.workers[usize::from(to)];
        match (op, answer) {
            (Op::Claim(n), answer) if worker.claim_pending == Some((n, sent)) => {
                worker.claim_pending = None;
                if let Answer::Granted(fence, attempt) = answer {
                    // Claimed past its budget: failed at once, never run.
                    let spent = self
                        .max_attempts
                        .is_some_and(|max| attempt > max && !self.has(Flaw::BudgetOnlyOnError));
                    if spent {
                        state.history.failed_by_budget = true;
                        self.send(state, to, Op::Fail(fence));
                    } else if now < deadline && worker.lease.is_none() {
                        // A grant that arrives past its deadline is not worked on.
                        worker.lease = Some(Held { fence, deadline });
                        state.history.ran += 1;
                    }
                }
            }
            (Op::Renew(fence), Answer::Accepted) => {
                if let Some(lease) = worker.lease.as_mut().filter(|l| l.fence == fence) {
                    lease.deadline = lease.deadline.max(deadline);
                }
            }
            // A refused renewal or write cancels the scope at once.
            (Op::Renew(fence) | Op::Write(fence), Answer::Refused)
                if worker.lease.is_some_and(|l| l.fence == fence) =>
            {
                worker.lease = None;
            }
            _ => {}
        }
    }
}

impl Model for LeaseModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            store: Store {
                fence: 0,
                owner: None,
                expires: 0,
                phase: Phase::Runnable,
                not_before: 0,
                per_worker: vec![0; usize::from(self.workers)],
                attempts: 0,
            },
            workers: vec![
                Worker {
                    lease: None,
                    claim_pending: None,
                    renew_sent: None,
                    claims: 0,
                    writes: 0,
                };
                usize::from(self.workers)
            ],
            net: Vec::new(),
            history: History::default(),
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        if state.now < self.max_time {
            actions.push(Action::Tick);
        }
        let room = state.net.len() < self.max_in_flight;
        for (i, worker) in state.workers.iter().enumerate() {
            let w = i as u8;
            let working = worker.lease.is_some_and(|l| state.now < l.deadline);
            if !room {
                continue;
            }
            // A worker may give up on a claim whose reply is late and claim again.
            if worker.lease.is_none() && worker.claims < self.claims_per_worker {
                actions.push(Action::Claim(w));
            }
            if working {
                if worker.renew_sent != Some(state.now) {
                    actions.push(Action::Renew(w));
                }
                if worker.writes < self.writes_per_worker {
                    actions.push(Action::Write(w));
                }
                // The budget model's workers only crash or give their run back.
                if self.max_attempts.is_none() {
                    actions.push(Action::Suspend(w));
                    actions.push(Action::Complete(w));
                }
                if self.life {
                    actions.push(Action::Retry(w));
                    actions.push(Action::Fail(w));
                }
                if self.max_attempts.is_some() {
                    actions.push(Action::Release(w));
                }
            }
        }
        if matches!(state.store.phase, Phase::Suspended | Phase::Failed) {
            actions.push(Action::Resume);
        }
        if self.cancel && !state.history.cancelled && !matches!(state.store.phase, Phase::Completed)
        {
            actions.push(Action::Cancel);
        }
        for (i, packet) in state.net.iter().enumerate() {
            // Identical packets are one choice, not several.
            if i > 0 && state.net[i - 1] == *packet {
                continue;
            }
            actions.push(Action::Deliver(i));
            actions.push(Action::Drop(i));
            if room && !packet.copy {
                actions.push(Action::Duplicate(i));
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        match action {
            Action::Tick => {
                state.now += 1;
                let now = state.now;
                // Past its local deadline a worker stops: the scope is cancelled.
                for worker in &mut state.workers {
                    if worker.lease.is_some_and(|l| now >= l.deadline) {
                        worker.lease = None;
                    }
                }
            }
            Action::Claim(w) => {
                let worker = &mut state.workers[usize::from(w)];
                worker.claims += 1;
                let n = worker.claims;
                worker.claim_pending = Some((n, state.now));
                self.send(&mut state, w, Op::Claim(n));
            }
            Action::Renew(w) => {
                let worker = &mut state.workers[usize::from(w)];
                worker.renew_sent = Some(state.now);
                let fence = worker.lease?.fence;
                self.send(&mut state, w, Op::Renew(fence));
            }
            Action::Write(w) => {
                let worker = &mut state.workers[usize::from(w)];
                worker.writes += 1;
                let fence = worker.lease?.fence;
                self.send(&mut state, w, Op::Write(fence));
            }
            Action::Suspend(w)
            | Action::Complete(w)
            | Action::Retry(w)
            | Action::Fail(w)
            | Action::Release(w) => {
                let worker = &mut state.workers[usize::from(w)];
                // Ending the lease stops the heartbeat and the work at once.
                let fence = worker.lease.take()?.fence;
                let op = match action {
                    Action::Suspend(_) => Op::Suspend(fence),
                    Action::Complete(_) => Op::Complete(fence),
                    Action::Retry(_) => Op::Retry(fence),
                    Action::Release(_) => Op::Release(fence),
                    _ => Op::Fail(fence),
                };
                self.send(&mut state, w, op);
            }
            Action::Resume => {
                state.store.phase = Phase::Runnable;
                state.store.attempts = 0;
                state.history.resumed = true;
                state.history.ran = 0;
                state.history.refunded = 0;
            }
            Action::Cancel => {
                let store = &mut state.store;
                let held = store.phase == Phase::Runnable
                    && store.owner.is_some()
                    && state.now < store.expires;
                state.history.cancelled = true;
                state.history.cancelled_held = held;
                if !(self.has(Flaw::CancelKeepsHolder) && held) {
                    // The fence stays; the phase no longer lets anything under it through.
                    store.phase = Phase::Cancelled;
                    store.owner = None;
                }
            }
            Action::Deliver(i) => {
                let packet = state.net.remove(i);
                match packet.msg {
                    Msg::Request { from, sent, op } => {
                        let answer = self.apply(&mut state, from, op);
                        state.net.push(Packet {
                            msg: Msg::Reply {
                                to: from,
                                sent,
                                op,
                                answer,
                            },
                            copy: false,
                        });
                        state.net.sort();
                    }
                    Msg::Reply {
                        to,
                        sent,
                        op,
                        answer,
                    } => self.receive(&mut state, to, sent, op, answer),
                }
            }
            Action::Drop(i) => {
                state.net.remove(i);
            }
            Action::Duplicate(i) => {
                let mut copy = state.net[i];
                copy.copy = true;
                state.net.push(copy);
                state.net.sort();
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always("fences never repeat", |_, s: &State| {
                !s.history.fence_repeated
            }),
            Property::always(
                "no write under an older fence is accepted after a newer one",
                |_, s: &State| !s.history.stale_after_newer,
            ),
            Property::always("one worker's writes per fence", |_, s: &State| {
                !s.history.shared_fence
            }),
            Property::always("a completed run completes once", |_, s: &State| {
                s.history.completes <= 1
            }),
            Property::always("a suspended run is never renewed", |_, s: &State| {
                !s.history.renewed_suspended
            }),
            Property::always(
                "at most one worker works on the run at a time",
                |_, s: &State| s.working() <= 1,
            ),
            Property::always(
                "no claim takes a run inside its retry delay",
                |_, s: &State| !s.history.claimed_in_delay,
            ),
            // Reachability: the model is not vacuous; each of these must be found.
            Property::sometimes("a run is reclaimed under a higher fence", |_, s: &State| {
                s.history.granted_max >= 2
            }),
            Property::sometimes("a stale write is refused", |_, s: &State| {
                s.history.stale_refused
            }),
            Property::sometimes("a run is completed", |_, s: &State| {
                s.history.completes == 1
            }),
            Property::sometimes(
                "a suspended run is resumed and reclaimed",
                |_, s: &State| s.history.claimed_after_resume,
            ),
        ];
        if self.max_attempts.is_some() {
            properties.push(Property::always(
                "no run is worked on more than its budget allows, unless attempts ended \
                 voluntarily",
                |m: &LeaseModel, s: &State| {
                    let max = m.max_attempts.unwrap_or(u8::MAX);
                    s.history.ran <= max.saturating_add(s.history.refunded)
                },
            ));
            properties.push(Property::sometimes(
                "a run whose attempts vanish is failed by its budget",
                |_, s: &State| s.history.failed_by_budget && s.store.phase == Phase::Failed,
            ));
            properties.push(Property::sometimes(
                "a voluntary release gives its attempt back",
                |_, s: &State| s.history.refunded > 0 && s.history.ran > 1,
            ));
        }
        if self.cancel {
            properties.push(Property::always(
                "nothing under a fence is accepted after a cancel",
                |_, s: &State| !s.history.accepted_after_cancel,
            ));
            properties.push(Property::always(
                "a cancelled run is never claimed",
                |_, s: &State| !s.history.claimed_after_cancel,
            ));
            properties.push(Property::sometimes(
                "a holder is refused after its run was cancelled",
                |_, s: &State| s.history.cancelled_held && s.history.holder_refused_after_cancel,
            ));
        }
        if self.life {
            // Reachable only with the rest of a run's life on.
            properties.push(Property::sometimes(
                "a run given back with a delay is claimed after it",
                |_, s: &State| s.history.retried,
            ));
            properties.push(Property::sometimes(
                "a failed run is resumed and reclaimed",
                |_, s: &State| s.history.claimed_after_failure,
            ));
        }
        properties
    }
}
