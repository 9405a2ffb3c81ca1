//! etcd's records as the contract's state machine reads them, and its decisions back.
//!
//! etcd times leases and delays with its own leases (a run's block key), not with the times a
//! record carries, which are this client's clock and for ordering and reporting only. So the
//! machine is shown each record **as etcd judges it**: a lease or delay whose block is there
//! (or whose chain of links has time left) has not run out, one whose block is gone has, and
//! the times are moved just enough to say so. [`machine::step`] then decides, and
//! [`absorb`] writes what it changed back into the record; the etcd mechanics (the block, the
//! links, the index position) stay with the plans that write them.

use lease_core::machine::{self, Applied, Op};
use lease_core::{Attempt, Fence, Kind, Result, RunId, StoreTime, WorkerId};

use super::Seen;
use crate::codec::{Rec, Tried};

/// Applies `op` to the run `seen` shows, at this client's `now` (microseconds): the record
/// after it (etcd's timing fields as read: the caller sets them) and what was done, or the
/// contract's refusal.
pub(super) fn step<'a>(
    run: &RunId,
    seen: &Seen,
    op: Op<'a>,
    now: u64,
) -> Result<(Rec, Applied<'a>)> {
    let rec = seen.live(run)?;
    let mut judged = view(seen, rec, now)?;
    let applied = machine::step(run, &mut judged, op, StoreTime::from_micros(now))?;
    let mut new = rec.clone();
    absorb(&mut new, judged);
    Ok((new, applied))
}

/// The record as etcd judges it at `now`.
fn view(seen: &Seen, rec: &Rec, now: u64) -> Result<machine::Run> {
    // Not run out: a block, or a long hold's or delay's chain with a link still to come.
    let running = seen.block.is_some() || rec.rest > 0;
    // Time left as etcd says: at least a millisecond while running, none once run out.
    let judged = |at: u64| {
        StoreTime::from_micros(if running {
            at.max(now + 1_000)
        } else {
            at.min(now)
        })
    };
    let time = |us: u64| (us > 0).then_some(StoreTime::from_micros(us));
    let kind = match &rec.kind {
        Some(kind) => Kind::new(kind)?,
        None => Kind::default(),
    };
    let mut run = machine::Run::created(
        kind,
        rec.priority,
        Fence::new(rec.fence)?,
        StoreTime::from_micros(rec.created),
        StoreTime::from_micros(rec.since),
    );
    run.state = super::state_of(rec);
    run.owner = rec.owner.as_deref().map(WorkerId::new).transpose()?;
    run.expires_at = run.owner.as_ref().map(|_| judged(rec.expires_at));
    run.claimable_at = match run.expires_at {
        Some(expiry) => expiry,
        // Runnable and unowned: delayed until etcd lets the block go, else claimable since
        // its index position (by `now` at the latest).
        None if run.state == lease_core::RunState::Runnable => {
            judged(if running { rec.not_before } else { rec.since })
        }
        // Suspended or ended: when that happened.
        None => StoreTime::from_micros(rec.since),
    };
    run.attempts = rec.attempts;
    run.heartbeats = rec.heartbeats;
    run.failure = rec.failure.clone();
    run.claimed_at = time(rec.claimed);
    run.renewed_at = time(rec.renewed);
    run.history = rec
        .history
        .iter()
        .map(Tried::attempt)
        .collect::<Result<_, _>>()?;
    Ok(run)
}

/// Writes what the machine decides into `rec`: state, fence, holder and expiry, the budget,
/// renewals, the reason, the claim's times and the history. Kind, priority and creation
/// never change; the index position, the delay and the links are the caller's.
fn absorb(rec: &mut Rec, run: machine::Run) {
    let micros = |at: Option<StoreTime>| at.map_or(0, StoreTime::as_micros);
    rec.state = Some(run.state);
    rec.fence = run.fence.get();
    rec.owner = run.owner.map(|w| w.as_str().to_owned());
    rec.expires_at = micros(run.expires_at);
    rec.attempts = run.attempts;
    rec.heartbeats = run.heartbeats;
    rec.failure = run.failure;
    rec.claimed = micros(run.claimed_at);
    rec.renewed = micros(run.renewed_at);
    rec.history = run.history.into_iter().map(tried).collect();
}

/// An attempt as the record stores it.
fn tried(attempt: Attempt) -> Tried {
    let micros = |at: Option<StoreTime>| at.map_or(0, StoreTime::as_micros);
    Tried {
        number: attempt.attempt,
        fence: attempt.fence.get(),
        worker: attempt.worker.as_str().to_owned(),
        claimed: micros(attempt.claimed_at),
        ended: micros(attempt.ended_at),
        outcome: attempt.outcome,
        error: attempt.error,
    }
}
