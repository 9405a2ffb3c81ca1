//! The reference model: what each run should be after each step, and how it follows the store
//! inside the windows where either answer is right.

use super::*;

/// The model's record of one run.
#[derive(Clone, Debug)]
pub(super) struct Run {
    pub(super) state: RunState,
    pub(super) owner: Option<WorkerId>,
    pub(super) fence: u64,
    pub(super) heartbeats: u64,
    /// The store's expiry lies in `[lo, hi]` (local monotonic time), when owned.
    pub(super) window: Option<(Instant, Instant)>,
    /// The end of a retry delay lies in `[lo, hi]`, when unowned and released with one.
    pub(super) delay: Option<(Instant, Instant)>,
    /// A failed run's reason.
    pub(super) failure: Option<String>,
    pub(super) journal: Vec<(u64, Vec<u8>)>,
    /// The payload it was created with (each life of an id its own).
    pub(super) payload: Option<Vec<u8>>,
    /// Of the other kind ([`OTHER_KIND`]), not the default.
    pub(super) other: bool,
    /// Not claimed since its creation: its first claim may start above the fence floor
    /// rather than one above the fence it was created at.
    pub(super) unclaimed: bool,
    /// While it waits for a signal (no timeout in the model): the wait's fence and name.
    pub(super) wait: Option<(u64, &'static str)>,
    /// The signal that answered its last wait: the wait's fence, the name, the payload.
    pub(super) answer: Option<(u64, &'static str, Vec<u8>)>,
}

impl Run {
    /// A run as `create` leaves it: runnable, unowned, fence 0, no heartbeats, no journal.
    pub(super) fn created() -> Run {
        Run {
            state: RunState::Runnable,
            owner: None,
            fence: 0,
            heartbeats: 0,
            window: None,
            delay: None,
            failure: None,
            journal: Vec::new(),
            payload: None,
            other: false,
            unclaimed: true,
            wait: None,
            answer: None,
        }
    }

    /// The contract's verdict on a signal for the wait of `fence` and `name` with `payload`
    /// (written here from the contract's text, not from `lease_core::signal`): `Ok(true)` for
    /// a duplicate of the delivery that answered it, `Ok(false)` to deliver.
    pub(super) fn signal(
        &self,
        id: &RunId,
        fence: u64,
        name: &str,
        payload: &[u8],
    ) -> Result<bool, Error> {
        let refused = |reason| {
            Err(Error::StaleSignal {
                run: id.clone(),
                state: self.state,
                reason,
            })
        };
        if let Some((f, n, p)) = &self.answer {
            if *f == fence && *n == name {
                return if p == payload {
                    Ok(true)
                } else {
                    refused(SignalRefusal::AlreadySignalled)
                };
            }
        }
        if fence > self.fence {
            return refused(SignalRefusal::UnknownWait);
        }
        match self.wait {
            Some((f, n)) if self.state == RunState::Suspended && f == fence => {
                if n == name {
                    Ok(false)
                } else {
                    refused(SignalRefusal::OtherSignal)
                }
            }
            Some((f, _)) if self.state == RunState::Suspended && f > fence => {
                refused(SignalRefusal::EarlierWait)
            }
            // The holder of that fence has not waited yet: kept for its wait, once.
            None if self.state == RunState::Runnable
                && self.owner.is_some()
                && self.fence == fence =>
            {
                if self.answer.as_ref().is_some_and(|(f, _, _)| *f == fence) {
                    refused(SignalRefusal::OtherSignal)
                } else {
                    Ok(false)
                }
            }
            _ => refused(SignalRefusal::NotWaiting),
        }
    }
}

/// The kind besides the default that runs of a store with kinds are created with.
pub(super) const OTHER_KIND: &str = "model-other";

/// The default kind, or the other one.
pub(super) fn kind(other: bool) -> lease_core::Kind {
    if other {
        lease_core::Kind::new(OTHER_KIND).expect("a valid kind")
    } else {
        lease_core::Kind::default()
    }
}

/// What the model knows of a lease's liveness at an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Liveness {
    Free,
    Held,
    Expired,
    Unsure,
    /// Unowned, its retry delay surely not over.
    Delayed,
    /// Unowned, its retry delay over or not.
    DelayUnsure,
}

pub(super) struct Model {
    pub(super) timing: Timing,
    pub(super) runs: BTreeMap<RunId, Run>,
    pub(super) leases: Vec<Lease>,
    /// A lower bound of the store's fence floor (the highest fence of any purged run, where
    /// every run is created): the store is shared by every case, and a purge here also
    /// removes ended runs of earlier cases, whose fences the model does not know. It rises
    /// with this case's purges and with every fence a create reports.
    pub(super) floor: u64,
    /// The highest fence each id was ever claimed at, over all its lives: no claim may
    /// issue one at or below it.
    pub(super) issued: BTreeMap<RunId, u64>,
    /// Runs created by `Step::Create` so far: each gets a payload of its own (none, empty, or
    /// text naming the life), so a payload left over from an earlier life of the id shows;
    /// and, on a store with kinds, every other life is of the other kind.
    pub(super) lives: u64,
    /// Whether the store has kinds (`claim_next_kind` of another kind is not refused).
    pub(super) kinds: bool,
}

impl Model {
    /// A run as `create` left it, which said it starts at `fence`: checked to be at least the
    /// floor as the model knows it, so never below a fence this case purged.
    pub(super) fn created(&mut self, fence: u64, what: &str) -> Run {
        assert!(
            fence >= self.floor,
            "{what}: created at {fence}, below the fence floor ({})",
            self.floor
        );
        self.floor = fence;
        let mut run = Run::created();
        run.fence = fence;
        run
    }

    /// Checks the fence of `lease`, a claim of `id` (as `run` was before it): one above the
    /// run's fence, or for the first claim of a life above the floor if that is higher (a
    /// store may lift a run created below the floor there), and above every fence the id was
    /// ever claimed at, in any life.
    pub(super) fn check_claim(&mut self, id: &RunId, run: &Run, lease: &Lease, what: &str) {
        let got = lease.fence().get();
        let lifted = run.unclaimed && got > run.fence.max(self.floor);
        assert!(
            got == run.fence + 1 || lifted,
            "{what}: the next fence: {got} after {} (floor {})",
            run.fence,
            self.floor
        );
        let issued = self.issued.entry(id.clone()).or_insert(0);
        assert!(
            got > *issued,
            "{what}: {id} claimed at {got}, at or below a fence it was claimed at before ({})",
            *issued
        );
        *issued = got;
    }

    /// How late after its window the store may still judge a lease live (or a delay running).
    pub(super) fn lag(&self) -> Duration {
        self.timing.capabilities().max_expiry_lag
    }

    /// The TTL a step's `short` flag asks for.
    pub(super) fn ttl(&self, short: bool) -> Ttl {
        if short {
            self.timing.ttl(SHORT_MS)
        } else {
            long_ttl()
        }
    }

    /// How long an `Advance(ms)` step sleeps: `ms` in proportion to the short TTL, so at
    /// scale 1 exactly `ms`.
    pub(super) fn advance(&self, ms: u64) -> Duration {
        Duration::from_millis(self.timing.ttl(SHORT_MS).as_millis() * ms / SHORT_MS)
    }

    pub(super) fn live(&self, run: &Run, sent: Instant, received: Instant) -> Liveness {
        match (run.owner.as_ref(), run.window) {
            (None, _) => match run.delay {
                None => Liveness::Free,
                Some((_, hi)) if sent >= hi + SLACK + self.lag() => Liveness::Free,
                Some((lo, _)) if received + SLACK <= lo => Liveness::Delayed,
                Some(_) => Liveness::DelayUnsure,
            },
            (Some(_), None) => Liveness::Unsure,
            (Some(_), Some((lo, hi))) => {
                if sent >= hi + SLACK + self.lag() {
                    Liveness::Expired
                } else if received + SLACK <= lo {
                    Liveness::Held
                } else {
                    Liveness::Unsure
                }
            }
        }
    }

    /// The verdict the contract gives a fenced write presenting `fence` on `run`.
    pub(super) fn verdict(&self, id: &RunId, fence: u64) -> Result<(), Error> {
        let Some(run) = self.runs.get(id) else {
            return Err(Error::NotFound { run: id.clone() });
        };
        if fence < run.fence {
            return Err(Error::StaleFence {
                run: id.clone(),
                presented: fence,
                current: run.fence,
            });
        }
        if fence > run.fence {
            return Err(Error::FenceAhead {
                run: id.clone(),
                presented: fence,
                current: run.fence,
            });
        }
        let ended = match (run.state, &run.owner) {
            (RunState::Suspended, _) => Ended::Suspended,
            (RunState::Completed, _) => Ended::Completed,
            (RunState::Failed, _) => Ended::Failed,
            (RunState::Cancelled, _) => Ended::Cancelled,
            (RunState::Runnable, None) => Ended::Released,
            (RunState::Runnable, Some(_)) => return Ok(()),
            (state, _) => unreachable!("the model holds no {state} run"),
        };
        Err(Error::LeaseEnded {
            run: id.clone(),
            fence,
            ended,
        })
    }
}

pub(super) fn claimed(run: &mut Run, lease: &Lease, sent: Instant, received: Instant) {
    run.fence = lease.fence().get();
    run.unclaimed = false;
    run.delay = None;
    run.owner = Some(lease.owner().clone());
    run.window = Some((
        sent + lease.ttl().as_duration(),
        received + lease.ttl().as_duration(),
    ));
}

pub(super) fn renewed(
    model: &mut Model,
    lease: &Lease,
    got: &Result<(), Error>,
    sent: Instant,
    received: Instant,
    what: &str,
) {
    let want = model.verdict(lease.run(), lease.fence().get());
    expect_same(what, got, &want);
    if got.is_ok() {
        let run = model.runs.get_mut(lease.run()).expect("known");
        run.heartbeats += 1;
        run.window = Some((
            sent + lease.ttl().as_duration(),
            received + lease.ttl().as_duration(),
        ));
    }
}
