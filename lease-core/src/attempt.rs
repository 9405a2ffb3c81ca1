//! A run's attempt history: how each of its last claims ended.
//!
//! A backend that keeps the history writes one [`Attempt`] when an attempt ends: in the same
//! write as the end (a fenced end, a force-release or a cancel of a held run), or, for a lease
//! that expired, in the claim that takes the run next. The attempt still held, or expired and
//! not claimed again, is not written: [`RunRecord::with_history`] adds it from the record.

use crate::limits::{MAX_ATTEMPT_ERROR_BYTES, MAX_HISTORY};
use std::fmt;
use std::str::FromStr;

use crate::{End, Fence, InvalidInput, RunRecord, RunState, StoreTime, WorkerId};

/// How an attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AttemptOutcome {
    /// Still held: the lease has not expired and nothing ended it.
    Held,
    /// Completed ([`End::Complete`], [`End::CompleteWith`]).
    Completed,
    /// Given back ([`End::Release`], [`End::RetryAfter`]), its attempt refunded.
    Released,
    /// Suspended ([`End::Suspend`]).
    Suspended,
    /// The attempt failed and the run was given back to be retried ([`End::AttemptFailed`]),
    /// with the error.
    Retried,
    /// The run was failed ([`End::Fail`]), with the reason.
    Failed,
    /// Its lease expired: the holder crashed, hung, or was cut off.
    Expired,
    /// An operator force-released the run while it was held.
    ForceReleased,
    /// The run was cancelled while it was held, with the cancellation's reason.
    Cancelled,
}

impl AttemptOutcome {
    /// Every outcome, in declaration order.
    pub const ALL: [AttemptOutcome; 9] = [
        AttemptOutcome::Held,
        AttemptOutcome::Completed,
        AttemptOutcome::Released,
        AttemptOutcome::Suspended,
        AttemptOutcome::Retried,
        AttemptOutcome::Failed,
        AttemptOutcome::Expired,
        AttemptOutcome::ForceReleased,
        AttemptOutcome::Cancelled,
    ];

    /// The outcome's name: `held`, `completed`, `released`, `suspended`, `retried`, `failed`,
    /// `expired`, `force-released` or `cancelled`. Backends store it under this name.
    pub fn as_str(&self) -> &'static str {
        match self {
            AttemptOutcome::Held => "held",
            AttemptOutcome::Completed => "completed",
            AttemptOutcome::Released => "released",
            AttemptOutcome::Suspended => "suspended",
            AttemptOutcome::Retried => "retried",
            AttemptOutcome::Failed => "failed",
            AttemptOutcome::Expired => "expired",
            AttemptOutcome::ForceReleased => "force-released",
            AttemptOutcome::Cancelled => "cancelled",
        }
    }

    /// The outcome an end writes, and the error text it keeps ([`attempt_error`]), if any.
    /// `None` for [`End::Committed`], whose end was written by the caller's transaction
    /// with its own outcome.
    pub fn of_end(end: &End) -> Option<(AttemptOutcome, Option<&str>)> {
        Some(match end {
            End::Complete | End::CompleteWith(_) => (AttemptOutcome::Completed, None),
            End::Release | End::RetryAfter(_) => (AttemptOutcome::Released, None),
            End::Suspend | End::AwaitSignal { .. } => (AttemptOutcome::Suspended, None),
            End::AttemptFailed { reason, .. } => {
                (AttemptOutcome::Retried, Some(attempt_error(reason)))
            }
            End::Fail(reason) => (AttemptOutcome::Failed, Some(attempt_error(reason))),
            End::Committed(_) => return None,
        })
    }
}

impl fmt::Display for AttemptOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AttemptOutcome {
    type Err = InvalidInput;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        AttemptOutcome::ALL
            .into_iter()
            .find(|o| o.as_str() == s)
            .ok_or_else(|| InvalidInput::UnknownOutcome {
                outcome: s.chars().take(32).collect(),
            })
    }
}

/// One attempt at a run: a claim and how it ended, on the store's clock.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Attempt {
    /// The attempt budget's counter after the claim ([`RunRecord::attempts`]): 1 for the first
    /// counted attempt since the run was created or resumed.
    pub attempt: u64,
    /// The claim's fence.
    pub fence: Fence,
    /// The worker that claimed it.
    pub worker: WorkerId,
    /// When the claim took the run; `None` where the store does not know.
    pub claimed_at: Option<StoreTime>,
    /// When the attempt ended: the end's commit, the force-release or cancel, or the lease's
    /// expiry. `None` while it is [held](AttemptOutcome::Held).
    pub ended_at: Option<StoreTime>,
    /// How it ended.
    pub outcome: AttemptOutcome,
    /// The error a [retried](AttemptOutcome::Retried) or [failed](AttemptOutcome::Failed)
    /// attempt gave, or a cancellation's reason, at most [`MAX_ATTEMPT_ERROR_BYTES`].
    pub error: Option<String>,
}

impl Attempt {
    /// An attempt of `worker` under `fence`, numbered `attempt`, that ended with `outcome`.
    /// Backends build it with the `with_*` setters.
    pub fn new(attempt: u64, fence: Fence, worker: WorkerId, outcome: AttemptOutcome) -> Attempt {
        Attempt {
            attempt,
            fence,
            worker,
            claimed_at: None,
            ended_at: None,
            outcome,
            error: None,
        }
    }

    /// Claimed at `claimed_at` and ended at `ended_at`.
    pub fn with_times(
        mut self,
        claimed_at: Option<StoreTime>,
        ended_at: Option<StoreTime>,
    ) -> Attempt {
        self.claimed_at = claimed_at;
        self.ended_at = ended_at;
        self
    }

    /// With the error text `error`.
    pub fn with_error(mut self, error: Option<String>) -> Attempt {
        self.error = error;
        self
    }
}

/// `reason` cut to at most [`MAX_ATTEMPT_ERROR_BYTES`], at a character boundary.
///
/// ```
/// use lease_core::{attempt_error, MAX_ATTEMPT_ERROR_BYTES};
/// assert_eq!(attempt_error("card declined"), "card declined");
/// let long = "é".repeat(MAX_ATTEMPT_ERROR_BYTES);
/// assert_eq!(attempt_error(&long).len(), MAX_ATTEMPT_ERROR_BYTES);
/// ```
pub fn attempt_error(reason: &str) -> &str {
    if reason.len() <= MAX_ATTEMPT_ERROR_BYTES {
        return reason;
    }
    let mut end = MAX_ATTEMPT_ERROR_BYTES;
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    &reason[..end]
}

impl RunRecord {
    /// With its attempt history: `ended`, the attempts the store wrote (oldest first), then
    /// the latest claim if nothing ended it yet: [held](AttemptOutcome::Held), or
    /// [expired](AttemptOutcome::Expired) at its lease's expiry. The last
    /// [`MAX_HISTORY`] of them.
    pub fn with_history(mut self, mut ended: Vec<Attempt>) -> RunRecord {
        if let (RunState::Runnable, Some(worker), Some(expires_at)) =
            (self.state, &self.owner, self.expires_at)
        {
            let expired = self.is_expired();
            let current = Attempt::new(
                self.attempts,
                self.fence,
                worker.clone(),
                if expired {
                    AttemptOutcome::Expired
                } else {
                    AttemptOutcome::Held
                },
            )
            .with_times(self.claimed_at, expired.then_some(expires_at));
            ended.push(current);
        }
        let extra = ended.len().saturating_sub(MAX_HISTORY);
        ended.drain(..extra);
        self.history = Some(ended);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RunId;

    fn record(owner: Option<(&str, u64)>, observed: u64) -> RunRecord {
        let mut r = RunRecord::new(
            RunId::new("r").unwrap(),
            RunState::Runnable,
            Fence::new(3).unwrap(),
            StoreTime::from_micros(observed),
        );
        r.attempts = 2;
        if let Some((w, exp)) = owner {
            r = r.with_lease(WorkerId::new(w).unwrap(), StoreTime::from_micros(exp));
        }
        r
    }

    fn ended(n: u64) -> Attempt {
        Attempt::new(
            n,
            Fence::new(n).unwrap(),
            WorkerId::new("old").unwrap(),
            AttemptOutcome::Retried,
        )
    }

    #[test]
    fn the_held_claim_is_the_last_attempt() {
        let r = record(Some(("w", 100)), 50).with_history(vec![ended(1), ended(2)]);
        let h = r.history.unwrap();
        assert_eq!(h.len(), 3);
        assert_eq!(
            (h[2].outcome, h[2].fence.get(), h[2].attempt),
            (AttemptOutcome::Held, 3, 2)
        );
        assert_eq!(h[2].ended_at, None);
    }

    #[test]
    fn an_expired_claim_ends_at_its_expiry() {
        let r = record(Some(("w", 100)), 150).with_history(Vec::new());
        let h = r.history.unwrap();
        assert_eq!(
            (h[0].outcome, h[0].ended_at),
            (AttemptOutcome::Expired, Some(StoreTime::from_micros(100)))
        );
    }

    #[test]
    fn an_unowned_run_adds_nothing_and_the_history_keeps_the_last_ten() {
        let r = record(None, 150).with_history((1..=12).map(ended).collect());
        let h = r.history.unwrap();
        assert_eq!(h.len(), MAX_HISTORY);
        assert_eq!((h[0].attempt, h[9].attempt), (3, 12));
        let r = record(Some(("w", 900)), 150).with_history((1..=10).map(ended).collect());
        let h = r.history.unwrap();
        assert_eq!((h[0].attempt, h[9].outcome), (2, AttemptOutcome::Held));
    }

    #[test]
    fn outcomes_round_trip_by_name_and_an_unknown_name_is_refused() {
        for o in AttemptOutcome::ALL {
            assert_eq!(o.as_str().parse::<AttemptOutcome>().unwrap(), o);
        }
        assert!(matches!(
            "exploded".parse::<AttemptOutcome>(),
            Err(InvalidInput::UnknownOutcome { .. })
        ));
    }

    #[test]
    fn an_error_is_cut_at_a_character_boundary() {
        let s = format!("a{}", "€".repeat(MAX_ATTEMPT_ERROR_BYTES));
        let cut = attempt_error(&s);
        assert!(cut.len() <= MAX_ATTEMPT_ERROR_BYTES && cut.len() > MAX_ATTEMPT_ERROR_BYTES - 3);
        assert!(s.starts_with(cut));
    }
}
