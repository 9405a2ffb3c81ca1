//! The steps a case is made of, and the strategies that generate them.

use super::*;

/// Which fence a fenced operation presents.
#[derive(Clone, Copy, Debug)]
pub enum Presented {
    /// The lease as claimed.
    Current,
    /// One below: a stale holder.
    Stale,
    /// One above: a fence the store never issued.
    Forged,
}

/// One step of a sequence. Indices pick modulo what exists.
#[derive(Clone, Debug)]
pub enum Step {
    /// `create(run)`.
    Create(usize),
    /// `claim(run, worker, ttl)`; `true` for the short TTL.
    Claim(usize, usize, bool),
    /// `claim_next(worker, ttl, max)`; with `true` last, `claim_next_kind` of the other kind
    /// (on a store that has kinds).
    ClaimNext(usize, bool, usize, bool),
    /// `renew(lease)`.
    Renew(usize, Presented),
    /// `renew_many(leases)`.
    RenewMany(Vec<(usize, Presented)>),
    /// `append(lease, payload)`.
    Append(usize, Presented, u8),
    /// `release(lease)`.
    Release(usize, Presented),
    /// `suspend(lease)`.
    Suspend(usize, Presented),
    /// `complete(lease)`.
    Complete(usize, Presented),
    /// The lease ends waiting for the `approval` signal, without a timeout (a suspend on a
    /// store without signals).
    Wait(usize, Presented),
    /// `end_many` of leases, each with its end (0 complete, 1 complete with an effect,
    /// 2 release, 3 suspend, 4 retry after the short TTL's length, 5 fail, 6 wait for the
    /// `approval` signal without a timeout, where the store has signals, else suspend).
    EndMany(Vec<(usize, Presented, u8)>),
    /// A signal for run i: of its current fence (0), one below (1), one above (2), or for
    /// another name (3), with payload `y` or `n`.
    Signal(usize, u8, bool),
    /// `create_many(runs)`, repeats included.
    CreateMany(Vec<usize>),
    /// `resume(run)`.
    Resume(usize),
    /// `force_release(run)`.
    ForceRelease(usize),
    /// `cancel` of run i.
    Cancel(usize),
    /// `inspect(run)` and `journal(run)`, compared with the model.
    Inspect(usize),
    /// `list` of the case's runs, optionally by state.
    List(Option<u8>),
    /// `purge(0, max)`: every ended run is due.
    Purge(usize),
    /// `purge(0, MAX_BATCH)` and `create(run)` at once: either order is right, and the id's
    /// next claim never reuses a fence of its purged life.
    PurgeRacingCreate(usize),
    /// Let this many milliseconds pass.
    Advance(u64),
}

pub(super) fn presented() -> impl Strategy<Value = Presented> {
    prop_oneof![
        6 => Just(Presented::Current),
        1 => Just(Presented::Stale),
        1 => Just(Presented::Forged),
    ]
}

pub(super) fn step() -> impl Strategy<Value = Step> {
    let run = 0..NAMES.len();
    let worker = 0..WORKERS.len();
    prop_oneof![
        3 => run.clone().prop_map(Step::Create),
        4 => (run.clone(), worker.clone(), any::<bool>()).prop_map(|(r, w, s)| Step::Claim(r, w, s)),
        2 => (worker, any::<bool>(), 1..4usize, any::<bool>())
            .prop_map(|(w, s, m, k)| Step::ClaimNext(w, s, m, k)),
        3 => (any::<usize>(), presented()).prop_map(|(l, p)| Step::Renew(l, p)),
        1 => prop::collection::vec((any::<usize>(), presented()), 1..4).prop_map(Step::RenewMany),
        3 => (any::<usize>(), presented(), any::<u8>()).prop_map(|(l, p, b)| Step::Append(l, p, b)),
        1 => (any::<usize>(), presented()).prop_map(|(l, p)| Step::Release(l, p)),
        1 => (any::<usize>(), presented()).prop_map(|(l, p)| Step::Suspend(l, p)),
        1 => (any::<usize>(), presented()).prop_map(|(l, p)| Step::Complete(l, p)),
        3 => (any::<usize>(), presented()).prop_map(|(l, p)| Step::Wait(l, p)),
        2 => prop::collection::vec((any::<usize>(), presented(), prop_oneof![6 => 0..6u8, 2 => Just(6u8)]), 1..4).prop_map(Step::EndMany),
        3 => (run.clone(), prop_oneof![3 => Just(0u8), 1 => 1..4u8], any::<bool>()).prop_map(|(r, w, y)| Step::Signal(r, w, y)),
        1 => prop::collection::vec(run.clone(), 1..4).prop_map(Step::CreateMany),
        1 => run.clone().prop_map(Step::Resume),
        1 => run.clone().prop_map(Step::ForceRelease),
        1 => run.clone().prop_map(Step::Cancel),
        2 => run.prop_map(Step::Inspect),
        1 => prop::option::of(0..5u8).prop_map(Step::List),
        1 => (1..4usize).prop_map(Step::Purge),
        1 => (0..NAMES.len()).prop_map(Step::PurgeRacingCreate),
        2 => (0..=2 * SHORT_MS).prop_map(Step::Advance),
    ]
}

/// Sequences of 1 to 24 steps.
pub fn sequences() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(step(), 1..24)
}
