//! A model-based property test: random sequences of operations by three workers, run against
//! a real store and against a reference model of the `LeaseStore` contract, which must agree
//! on every verdict and every record.
//!
//! Time is real (expiry is on the store's clock), advanced explicitly by `Advance` steps, with
//! short TTLs so that leases expire inside sequences. The model knows when each lease was sent
//! and answered, so it knows the window in which the store's expiry lies; an operation that
//! lands inside that window may see the lease live or expired, and the model accepts either
//! and follows the store. Everything else is exact.
//!
//! Cases share one store: each case uses its own run-id prefix and retires its runs (completes
//! them) at the end, so `claim_next` of a later case never sees them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lease_core::{
    End, Ended, Ending, Error, Fence, Lease, LeaseStore, LeaseStoreExt, ListFilter, RunId,
    RunRecord, RunState, SignalExt, SignalName, SignalRefusal, SignalToken, StoreTime, Ttl,
    WorkerId,
};
use proptest::prelude::*;
use tokio::time::Instant;

use crate::{StoreFactory, Timing};

mod model;
mod steps;

use model::*;
pub use steps::{sequences, Presented, Step};

/// Run names a case may use (after its prefix), hostile ones included.
const NAMES: [&str; 5] = ["a", "b:{x}", "ä €", "c}{", "d d"];
/// Workers.
const WORKERS: [&str; 3] = ["w0", "w1", "w2:{x}"];
/// The short TTL at scale 1: expires within a sequence. A store that cannot time it declares
/// so in its [`Capabilities`](crate::Capabilities): the short TTL is then stretched
/// ([`Timing::ttl`]) and `Advance` steps with it, in the same proportion.
const SHORT_MS: u64 = 25;
/// The long TTL: never expires within a sequence.
const LONG_MS: u64 = 60_000;

/// The model's run after its lease of `fence` ended waiting for [`WAITED`] (its state already
/// suspended): waiting, or at once runnable if a signal came for it while the lease held it.
fn model_wait(run: &mut Run, fence: u64) {
    if run
        .answer
        .as_ref()
        .is_some_and(|(f, n, _)| *f == fence && *n == WAITED)
    {
        run.state = RunState::Runnable;
    } else {
        run.wait = Some((fence, WAITED));
        run.answer = None;
    }
}

/// The signal the model's runs wait for.
const WAITED: &str = "approval";
/// The reason the sequences cancel with.
const CANCEL_REASON: &str = "cancelled by the model: {ä}";
/// Store clocks have µs precision and statement start times: this much either side of a window
/// counts as inside it (and, after the window, the store's declared expiry lag).
const SLACK: Duration = Duration::from_millis(3);

/// Two results agree: both `Ok`, or the same error with the same fields (a `Held`'s time left
/// is not compared: it depends on when the store looked).
fn same_error(got: &Error, want: &Error) -> bool {
    match (got, want) {
        (
            Error::Held { run, owner, .. },
            Error::Held {
                run: r2, owner: o2, ..
            },
        ) => run == r2 && owner == o2,
        (Error::Delayed { run, .. }, Error::Delayed { run: r2, .. }) => run == r2,
        _ => format!("{got:?}") == format!("{want:?}"),
    }
}

#[track_caller]
fn expect_same<T: std::fmt::Debug>(what: &str, got: &Result<T, Error>, want: &Result<(), Error>) {
    let ok = match (got, want) {
        (Ok(_), Ok(())) => true,
        (Err(g), Err(w)) => same_error(g, w),
        _ => false,
    };
    assert!(ok, "{what}: the store said {got:?}, the model {want:?}");
}

/// The TTL that never expires within a sequence.
fn long_ttl() -> Ttl {
    Ttl::from_millis(LONG_MS).expect("valid TTL")
}

/// Runs `steps` against `store` and the model; panics at the first disagreement. `case` makes
/// the run ids unique to this sequence. For a store with the default capabilities; see
/// [`check_sequence_with`] for others.
pub async fn check_sequence(store: &dyn LeaseStore, case: u64, steps: &[Step]) {
    check_sequence_with(store, Timing::default(), case, steps).await;
}

/// [`check_sequence`] with the timings of a store's capabilities
/// ([`LeaseStore::capabilities`]).
pub async fn check_sequence_with(
    store: &dyn LeaseStore,
    timing: Timing,
    case: u64,
    steps: &[Step],
) {
    let prefix = format!("m{case:08}-");
    let ids: Vec<RunId> = NAMES
        .iter()
        .map(|n| RunId::new(format!("{prefix}{n}")).expect("valid id"))
        .collect();
    let workers: Vec<WorkerId> = WORKERS
        .iter()
        .map(|w| WorkerId::new(*w).expect("valid worker"))
        .collect();
    let kinds = sweep(store).await;
    let mut model = Model {
        timing,
        runs: BTreeMap::new(),
        leases: Vec::new(),
        floor: 0,
        issued: BTreeMap::new(),
        lives: 0,
        kinds,
    };
    for (n, step) in steps.iter().enumerate() {
        let what = format!("step {n} {step:?}");
        apply(store, &mut model, &prefix, &ids, &workers, step, &what).await;
    }
    retire(store, &model, &ids).await;
}

/// The lease a step refers to, with the fence it presents; `None` when there are no leases yet.
fn pick(model: &Model, index: usize, presented: Presented) -> Option<Lease> {
    if model.leases.is_empty() {
        return None;
    }
    let lease = &model.leases[index % model.leases.len()];
    let fence = match presented {
        Presented::Current => lease.fence().get(),
        Presented::Stale if lease.fence().get() > 1 => lease.fence().get() - 1,
        Presented::Stale => return None,
        Presented::Forged => lease.fence().get() + 1,
    };
    Some(
        Lease::new(
            lease.run().clone(),
            lease.owner().clone(),
            Fence::new(fence).expect("small fence"),
            lease.ttl(),
            StoreTime::from_micros(0),
        )
        .expect("fence above 0")
        .carrying(lease),
    )
}

async fn apply(
    store: &dyn LeaseStore,
    model: &mut Model,
    prefix: &str,
    ids: &[RunId],
    workers: &[WorkerId],
    step: &Step,
    what: &str,
) {
    let sent = Instant::now();
    match step {
        Step::Create(r) => {
            let id = &ids[*r];
            model.lives += 1;
            let payload = match model.lives % 3 {
                0 => None,
                1 => Some(Vec::new()),
                _ => Some(format!("life {} of {id}", model.lives).into_bytes()),
            };
            let other = model.kinds && model.lives % 2 == 0;
            let mut new = lease_core::NewRun::new(id.clone()).with_kind(kind(other));
            if let Some(p) = &payload {
                new = new.with_payload(p.clone());
            }
            let got = store.create_with(&new).await;
            let want = if model.runs.contains_key(id) {
                Err(Error::AlreadyExists { run: id.clone() })
            } else {
                Ok(())
            };
            expect_same(what, &got, &want);
            if let Ok(record) = got {
                let mut run = model.created(record.fence.get(), what);
                assert_eq!(record.payload, payload, "{what}: the created payload");
                assert_eq!(record.kind, kind(other), "{what}: the created kind");
                run.payload = payload;
                run.other = other;
                model.runs.insert(id.clone(), run);
            }
        }
        Step::Claim(r, w, short) => {
            let id = &ids[*r];
            let got = store.claim(id, &workers[*w], model.ttl(*short)).await;
            let received = Instant::now();
            let Some(run) = model.runs.get(id) else {
                expect_same(what, &got, &Err(Error::NotFound { run: id.clone() }));
                return;
            };
            let live = model.live(run, sent, received);
            let delayed = Error::Delayed {
                run: id.clone(),
                remaining: Duration::ZERO,
            };
            let want: Result<(), Error> = match run.state {
                RunState::Suspended => Err(Error::Suspended { run: id.clone() }),
                RunState::Completed => Err(Error::Completed { run: id.clone() }),
                RunState::Failed => Err(Error::Failed { run: id.clone() }),
                RunState::Cancelled => Err(Error::Cancelled { run: id.clone() }),
                RunState::Runnable => match live {
                    Liveness::Delayed => Err(delayed),
                    Liveness::DelayUnsure => match &got {
                        Ok(_) => Ok(()),
                        Err(_) => Err(delayed),
                    },
                    Liveness::Held => Err(Error::Held {
                        run: id.clone(),
                        owner: run.owner.clone().expect("owned"),
                        remaining: Duration::ZERO,
                    }),
                    Liveness::Free | Liveness::Expired => Ok(()),
                    // Either is right: follow the store.
                    Liveness::Unsure => match &got {
                        Ok(_) => Ok(()),
                        Err(_) => Err(Error::Held {
                            run: id.clone(),
                            owner: run.owner.clone().expect("owned"),
                            remaining: Duration::ZERO,
                        }),
                    },
                },
                state => unreachable!("the model holds no {state} run"),
            };
            expect_same(what, &got, &want);
            if let Ok(lease) = got {
                let before = model.runs.get(id).expect("known").clone();
                model.check_claim(id, &before, &lease, what);
                let run = model.runs.get_mut(id).expect("known");
                assert_eq!(
                    lease.payload(),
                    run.payload.as_deref(),
                    "{what}: the payload"
                );
                assert_eq!(lease.kind(), &kind(run.other), "{what}: the lease's kind");
                claimed(run, &lease, sent, received);
                model.leases.push(lease);
            }
        }
        Step::ClaimNext(w, short, max, other) => {
            let other = *other && model.kinds;
            let got = store
                .claim_next_kind(&kind(other), &workers[*w], model.ttl(*short), *max)
                .await
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let received = Instant::now();
            let mut sure = Vec::new();
            let mut maybe = Vec::new();
            for (id, run) in &model.runs {
                if run.state != RunState::Runnable || run.other != other {
                    continue;
                }
                match model.live(run, sent, received) {
                    Liveness::Free | Liveness::Expired => sure.push(id.clone()),
                    Liveness::Unsure | Liveness::DelayUnsure => maybe.push(id.clone()),
                    Liveness::Held | Liveness::Delayed => {}
                }
            }
            let mut seen = Vec::new();
            for lease in &got {
                let id = lease.run();
                assert!(
                    ids.contains(id),
                    "{what}: handed out {id}, which is not this case's"
                );
                assert!(
                    sure.contains(id) || maybe.contains(id),
                    "{what}: handed out {id}, which the model holds live or ended"
                );
                assert!(!seen.contains(id), "{what}: handed out {id} twice");
                seen.push(id.clone());
            }
            if got.len() < *max {
                for id in &sure {
                    assert!(
                        seen.contains(id),
                        "{what}: {id} was claimable but not handed out ({} of at most {max})",
                        got.len()
                    );
                }
            } else {
                assert_eq!(got.len(), *max, "{what}: at most max");
            }
            for lease in got {
                let before = model.runs.get(lease.run()).expect("known").clone();
                model.check_claim(lease.run(), &before, &lease, what);
                let run = model.runs.get_mut(lease.run()).expect("known");
                assert_eq!(
                    lease.payload(),
                    run.payload.as_deref(),
                    "{what}: the payload"
                );
                assert_eq!(lease.kind(), &kind(run.other), "{what}: the lease's kind");
                claimed(run, &lease, sent, received);
                model.leases.push(lease);
            }
        }
        Step::Renew(l, p) => {
            let Some(lease) = pick(model, *l, *p) else {
                return;
            };
            let got = store.renew(&lease).await;
            let received = Instant::now();
            renewed(model, &lease, &got.map(drop), sent, received, what);
        }
        Step::RenewMany(picks) => {
            let mut batch: Vec<Lease> = Vec::new();
            for (l, p) in picks {
                if let Some(lease) = pick(model, *l, *p) {
                    // One renewal per run in a batch: the contract says nothing of a run twice.
                    if !batch.iter().any(|b| b.run() == lease.run()) {
                        batch.push(lease);
                    }
                }
            }
            if batch.is_empty() {
                return;
            }
            let got = store
                .renew_many(&batch)
                .await
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let received = Instant::now();
            assert_eq!(got.len(), batch.len(), "{what}: a result per lease");
            for (lease, one) in batch.iter().zip(got) {
                renewed(model, lease, &one.map(drop), sent, received, what);
            }
        }
        Step::Append(l, p, byte) => {
            let Some(lease) = pick(model, *l, *p) else {
                return;
            };
            let payload = vec![*byte, b':', 0, b'\n'];
            let got = store.append(&lease, &payload).await;
            let want = model.verdict(lease.run(), lease.fence().get());
            expect_same(what, &got, &want);
            if let Ok(entry) = got {
                assert_eq!(entry.fence, lease.fence(), "{what}: entry fence");
                let run = model.runs.get_mut(lease.run()).expect("known");
                run.journal.push((lease.fence().get(), payload));
            }
        }
        Step::Release(l, p) | Step::Suspend(l, p) | Step::Complete(l, p) | Step::Wait(l, p) => {
            let Some(lease) = pick(model, *l, *p) else {
                return;
            };
            let got = match step {
                Step::Release(..) => store.release(&lease).await,
                Step::Suspend(..) => store.suspend(&lease).await,
                Step::Wait(..) if store.capabilities().signals => {
                    let end = End::await_signal_unbounded(WAITED).expect("a valid name");
                    store.end_one(&lease, end).await
                }
                Step::Wait(..) => store.suspend(&lease).await,
                _ => store.complete(&lease).await,
            };
            let want = model.verdict(lease.run(), lease.fence().get());
            expect_same(what, &got, &want);
            if got.is_ok() {
                let run = model.runs.get_mut(lease.run()).expect("known");
                run.owner = None;
                run.window = None;
                run.state = match step {
                    Step::Release(..) => RunState::Runnable,
                    Step::Suspend(..) | Step::Wait(..) => RunState::Suspended,
                    _ => RunState::Completed,
                };
                if matches!(step, Step::Wait(..)) && store.capabilities().signals {
                    model_wait(run, lease.fence().get());
                }
            }
        }
        Step::EndMany(picks) => {
            let mut batch: Vec<Ending> = Vec::new();
            for (l, p, kind) in picks {
                if let Some(lease) = pick(model, *l, *p) {
                    // The same run twice is refused as a whole (checked by a scenario).
                    if !batch.iter().any(|b| b.lease.run() == lease.run()) {
                        let end = match kind {
                            0 => End::Complete,
                            1 => End::CompleteWith(vec![*kind, b'=', 0, b'\n']),
                            2 => End::Release,
                            3 => End::Suspend,
                            4 => End::RetryAfter(model.timing.ttl(SHORT_MS).as_duration()),
                            6 if store.capabilities().signals => {
                                End::await_signal_unbounded(WAITED).expect("a valid name")
                            }
                            6 => End::Suspend,
                            _ => End::Fail(format!("gave up: {{\u{e4}}} #{kind}")),
                        };
                        batch.push(Ending::new(lease, end));
                    }
                }
            }
            if batch.is_empty() {
                return;
            }
            let got = store
                .end_many(&batch)
                .await
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let received = Instant::now();
            assert_eq!(got.len(), batch.len(), "{what}: a result per item");
            for (item, one) in batch.iter().zip(got) {
                let want = model.verdict(item.lease.run(), item.lease.fence().get());
                expect_same(what, &one, &want);
                if one.is_ok() {
                    let run = model.runs.get_mut(item.lease.run()).expect("known");
                    run.owner = None;
                    run.window = None;
                    run.state = item.end.state();
                    match &item.end {
                        End::CompleteWith(payload) => run
                            .journal
                            .push((item.lease.fence().get(), payload.clone())),
                        End::RetryAfter(delay) => {
                            run.delay = Some((sent + *delay, received + *delay));
                        }
                        End::Fail(reason) => run.failure = Some(reason.clone()),
                        End::AwaitSignal { .. } => model_wait(run, item.lease.fence().get()),
                        _ => {}
                    }
                }
            }
        }
        Step::CreateMany(rs) => {
            let batch: Vec<RunId> = rs.iter().map(|r| ids[*r].clone()).collect();
            let got = store
                .create_many(&batch)
                .await
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(got.len(), batch.len(), "{what}: a result per id");
            for (id, one) in batch.iter().zip(got) {
                let want = if model.runs.contains_key(id) {
                    Err(Error::AlreadyExists { run: id.clone() })
                } else {
                    Ok(())
                };
                expect_same(what, &one, &want);
                if one.is_ok() {
                    // A batch answers no fence: read it.
                    let fence = store.inspect(id).await.expect("created").fence.get();
                    let run = model.created(fence, what);
                    model.runs.insert(id.clone(), run);
                }
            }
        }
        Step::Signal(r, which, yes) => {
            if !store.capabilities().signals {
                return;
            }
            // A run that waits or was answered, if there is one (else any of the case's), so
            // most signals meet a wait, its answer, or the run after it.
            let waiting: Vec<&RunId> = model
                .runs
                .iter()
                .filter(|(_, run)| run.wait.is_some() || run.answer.is_some())
                .map(|(id, _)| id)
                .collect();
            let id = &if waiting.is_empty() {
                ids[*r].clone()
            } else {
                waiting[*r % waiting.len()].clone()
            };
            let current = model.runs.get(id).map_or(1, |run| run.fence.max(1));
            let (fence, name) = match which {
                // The wait's own fence, or the answered wait's, whichever the run has.
                0 => match model.runs.get(id) {
                    Some(Run {
                        wait: Some((f, _)), ..
                    }) => (*f, WAITED),
                    Some(Run {
                        answer: Some((f, _, _)),
                        ..
                    }) => (*f, WAITED),
                    _ => (current, WAITED),
                },
                1 if current > 1 => (current - 1, WAITED),
                1 => return,
                2 => (current + 1, WAITED),
                _ => (current, "other"),
            };
            let payload: &[u8] = if *yes { b"y" } else { b"n" };
            let token = SignalToken::new(
                id.clone(),
                SignalName::new(name).expect("a valid name"),
                Fence::new(fence).expect("small fence"),
                store.signal_key(),
            );
            let got = store.signal(&token, payload).await;
            let want = match model.runs.get(id) {
                None => Err(Error::NotFound { run: id.clone() }),
                Some(run) => run.signal(id, fence, name, payload),
            };
            match (&got, &want) {
                (Ok(s), Ok(duplicate)) => {
                    assert_eq!(s.duplicate, *duplicate, "{what}: duplicate")
                }
                (got, want) => expect_same(
                    what,
                    got,
                    &want.as_ref().map(|_| ()).map_err(Error::duplicate),
                ),
            }
            if let (Ok(s), Some(run)) = (&got, model.runs.get_mut(id)) {
                if !s.duplicate {
                    // Delivered to the wait, or kept for the holder's (which stays held).
                    if run.owner.is_none() {
                        run.state = RunState::Runnable;
                        run.wait = None;
                        run.delay = None;
                    }
                    run.answer = Some((fence, name, payload.to_vec()));
                }
            }
        }
        Step::Resume(r) => {
            let id = &ids[*r];
            let got = store.resume(id).await;
            let want = match model.runs.get(id) {
                None => Err(Error::NotFound { run: id.clone() }),
                Some(run) if !matches!(run.state, RunState::Suspended | RunState::Failed) => {
                    Err(Error::NotSuspended {
                        run: id.clone(),
                        state: run.state,
                    })
                }
                Some(_) => Ok(()),
            };
            expect_same(what, &got, &want);
            if got.is_ok() {
                let run = model.runs.get_mut(id).expect("known");
                run.state = RunState::Runnable;
                run.failure = None;
                run.wait = None;
            }
        }
        Step::ForceRelease(r) => {
            let id = &ids[*r];
            let got = store.force_release(id).await;
            let want = match model.runs.get(id).map(|run| run.state) {
                None => Err(Error::NotFound { run: id.clone() }),
                Some(RunState::Suspended) => Err(Error::Suspended { run: id.clone() }),
                Some(RunState::Completed) => Err(Error::Completed { run: id.clone() }),
                Some(RunState::Failed) => Err(Error::Failed { run: id.clone() }),
                Some(RunState::Cancelled) => Err(Error::Cancelled { run: id.clone() }),
                Some(RunState::Runnable) => Ok(()),
                Some(state) => unreachable!("the model holds no {state} run"),
            };
            expect_same(what, &got, &want);
            if got.is_ok() {
                let run = model.runs.get_mut(id).expect("known");
                run.owner = None;
                run.window = None;
                run.delay = None;
            }
        }
        Step::Cancel(r) => {
            let id = &ids[*r];
            let got = store.cancel(id, CANCEL_REASON).await;
            let want = match model.runs.get(id).map(|run| run.state) {
                None => Err(Error::NotFound { run: id.clone() }),
                Some(RunState::Completed) => Err(Error::Completed { run: id.clone() }),
                Some(_) => Ok(()),
            };
            expect_same(what, &got, &want);
            if let Ok(record) = &got {
                let run = model.runs.get_mut(id).expect("known");
                if run.state != RunState::Cancelled {
                    run.wait = None;
                    run.state = RunState::Cancelled;
                    run.failure = Some(CANCEL_REASON.to_owned());
                    run.owner = None;
                    run.window = None;
                    run.delay = None;
                }
                assert_eq!(
                    (
                        record.state,
                        record.owner.as_ref(),
                        record.fence.get(),
                        record.failure.as_deref()
                    ),
                    (RunState::Cancelled, None, run.fence, run.failure.as_deref()),
                    "{what}: the cancelled record (a second cancel changes nothing)"
                );
            }
        }
        Step::Inspect(r) => {
            let id = &ids[*r];
            let got = store.inspect(id).await;
            let received = Instant::now();
            let journal = store.journal(id).await;
            match model.runs.get(id) {
                None => {
                    expect_same(what, &got, &Err(Error::NotFound { run: id.clone() }));
                    expect_same(what, &journal, &Err(Error::NotFound { run: id.clone() }));
                }
                Some(run) => {
                    let got = got.unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert_eq!(
                        (
                            got.state,
                            got.owner.as_ref(),
                            got.fence.get(),
                            got.heartbeats
                        ),
                        (run.state, run.owner.as_ref(), run.fence, run.heartbeats),
                        "{what}: record (state, owner, fence, heartbeats)"
                    );
                    assert_eq!(
                        got.expires_at.is_some(),
                        run.owner.is_some(),
                        "{what}: expiry"
                    );
                    assert_eq!(got.failure, run.failure, "{what}: failure reason");
                    assert_eq!(
                        got.wait
                            .as_ref()
                            .map(|w| (w.fence.get(), w.name.as_str(), w.deadline)),
                        run.wait.map(|(f, n)| (f, n, None)),
                        "{what}: the wait"
                    );
                    assert_eq!(
                        got.resumed.as_ref().and_then(|r| r.signal()).map(|s| (
                            s.fence.get(),
                            s.name.as_str(),
                            s.payload().to_vec()
                        )),
                        run.answer.clone(),
                        "{what}: the last wait's signal"
                    );
                    assert_eq!(got.kind, kind(run.other), "{what}: kind");
                    let delayed = run.state == RunState::Runnable
                        && run.owner.is_none()
                        && run.delay.is_some();
                    match model.live(run, sent, received) {
                        Liveness::Delayed if delayed => assert!(
                            got.not_before.is_some_and(|at| at > got.observed_at),
                            "{what}: a delayed run's not_before, got {:?}",
                            got.not_before
                        ),
                        Liveness::DelayUnsure if delayed => {}
                        _ => assert_eq!(got.not_before, None, "{what}: not delayed"),
                    }
                    let journal: Vec<(u64, Vec<u8>)> = journal
                        .unwrap_or_else(|e| panic!("{what}: {e}"))
                        .into_iter()
                        .map(|e| (e.fence.get(), e.payload))
                        .collect();
                    assert_eq!(journal, run.journal, "{what}: journal");
                }
            }
        }
        Step::List(state) => {
            let state = state.map(|s| match s {
                0 => RunState::Runnable,
                1 => RunState::Suspended,
                2 => RunState::Completed,
                3 => RunState::Failed,
                _ => RunState::Cancelled,
            });
            // Every id of this case sorts after the prefix without its '-'.
            let filter = ListFilter::new()
                .with_state(state)
                .with_expired(false)
                .with_after(Some(
                    RunId::new(prefix.trim_end_matches('-')).expect("valid id"),
                ))
                .with_limit(NAMES.len());
            let got = store
                .list(&filter)
                .await
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let got: Vec<(RunId, RunState, Option<WorkerId>, u64, u64)> = got
                .into_iter()
                .filter(|r| r.run.as_str().starts_with(prefix))
                .map(|r| (r.run, r.state, r.owner, r.fence.get(), r.heartbeats))
                .collect();
            let want: Vec<(RunId, RunState, Option<WorkerId>, u64, u64)> = model
                .runs
                .iter()
                .filter(|(_, run)| state.is_none_or(|s| run.state == s))
                .map(|(id, run)| {
                    (
                        id.clone(),
                        run.state,
                        run.owner.clone(),
                        run.fence,
                        run.heartbeats,
                    )
                })
                .collect();
            assert_eq!(got, want, "{what}: list");
        }
        Step::Purge(max) => {
            let got = store
                .purge(Duration::ZERO, *max)
                .await
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(got.len() <= *max, "{what}: at most max");
            // The store is shared with earlier cases, whose retired runs may come first.
            for id in got.iter().filter(|id| ids.contains(id)) {
                let run = model
                    .runs
                    .remove(id)
                    .unwrap_or_else(|| panic!("{what}: purged {id}, which does not exist"));
                assert!(
                    matches!(
                        run.state,
                        RunState::Completed | RunState::Failed | RunState::Cancelled
                    ),
                    "{what}: purged {id}, which is {}",
                    run.state
                );
                model.floor = model.floor.max(run.fence);
            }
            if got.len() < *max {
                for (id, run) in &model.runs {
                    assert!(
                        !matches!(
                            run.state,
                            RunState::Completed | RunState::Failed | RunState::Cancelled
                        ),
                        "{what}: {id} is {} but was not purged ({} of at most {max})",
                        run.state,
                        got.len()
                    );
                }
            }
        }
        Step::PurgeRacingCreate(r) => {
            let id = &ids[*r];
            let (purged, created) = tokio::join!(
                store.purge(Duration::ZERO, lease_core::MAX_BATCH),
                store.create(id)
            );
            let purged = purged.unwrap_or_else(|e| panic!("{what}: purge: {e}"));
            let existed = model.runs.get(id).map(|run| run.fence);
            let floor_before = model.floor;
            for gone in purged.iter().filter(|gone| ids.contains(gone)) {
                let run = model
                    .runs
                    .remove(gone)
                    .unwrap_or_else(|| panic!("{what}: purged {gone}, which does not exist"));
                assert!(
                    matches!(
                        run.state,
                        RunState::Completed | RunState::Failed | RunState::Cancelled
                    ),
                    "{what}: purged {gone}, which is {}",
                    run.state
                );
                model.floor = model.floor.max(run.fence);
            }
            // Created at the floor as it stood before the purge or after it: a store whose
            // create reads the floor in a snapshot (Postgres) may create a purged id below its
            // last fence, and then must lift its first claim above the floor, which the
            // claims check (Model::check_claim) with every fence the id was claimed at.
            let mut created_at = |record: &RunRecord| {
                let fence = record.fence.get();
                assert!(
                    fence >= floor_before,
                    "{what}: created at {fence}, below the fence floor before the purge \
                     ({floor_before})"
                );
                model.floor = model.floor.max(fence);
                let mut run = Run::created();
                run.fence = fence;
                model.runs.insert(id.clone(), run);
            };
            match (existed, purged.contains(id), created) {
                // It did not exist: created.
                (None, _, Ok(record)) => created_at(&record),
                // It existed and was not purged: it exists.
                (Some(_), false, Err(Error::AlreadyExists { .. })) => {}
                // Purged, then created.
                (Some(_), true, Ok(record)) => created_at(&record),
                // Created (refused, it existed), then purged: gone.
                (Some(_), true, Err(Error::AlreadyExists { .. })) => {}
                (existed, purged, created) => panic!(
                    "{what}: existed at fence {existed:?}, purged {purged}, create said \
                     {created:?}"
                ),
            }
        }
        Step::Advance(ms) => tokio::time::sleep(model.advance(*ms)).await,
    }
}

/// Completes every run of the case that is not completed yet, so later cases' `claim_next`
/// never meets it.
async fn retire(store: &dyn LeaseStore, model: &Model, ids: &[RunId]) {
    let retirer = WorkerId::new("retirer").expect("valid worker");
    for id in ids.iter().filter(|id| model.runs.contains_key(*id)) {
        let record = store.inspect(id).await.expect("inspect to retire");
        match record.state {
            RunState::Completed | RunState::Cancelled => continue,
            RunState::Suspended | RunState::Failed => {
                drop(store.resume(id).await.expect("resume to retire"))
            }
            RunState::Runnable => {}
            state => panic!("cannot retire a run in state {state}"),
        }
        store
            .force_release(id)
            .await
            .expect("force release to retire");
        let lease = store
            .claim(id, &retirer, long_ttl())
            .await
            .expect("claim to retire");
        store.complete(&lease).await.expect("complete to retire");
    }
}

/// Completes every claimable run left by an earlier sequence that failed before retiring its
/// own (while a failure is being shrunk), of both kinds, so this sequence's claims see only its
/// runs. Returns whether the store has kinds.
async fn sweep(store: &dyn LeaseStore) -> bool {
    let janitor = WorkerId::new("janitor").expect("valid worker");
    let mut kinds = true;
    for other in [false, true] {
        loop {
            let leftovers = match store
                .claim_next_kind(&kind(other), &janitor, long_ttl(), 100)
                .await
            {
                Ok(leases) => leases,
                Err(Error::InvalidInput(lease_core::InvalidInput::Unsupported { .. })) if other => {
                    kinds = false;
                    break;
                }
                Err(e) => panic!("claim leftovers: {e}"),
            };
            if leftovers.is_empty() {
                break;
            }
            for lease in leftovers {
                store.complete(&lease).await.expect("complete leftovers");
            }
        }
    }
    kinds
}

/// Runs `cases` random sequences (`LEASE_MODEL_CASES` overrides) against one store from
/// `factory`, each checked against the model. A failure is shrunk to a short sequence and
/// printed as the steps to replay with [`check_sequence_with`].
///
/// # Panics
/// On the first disagreement between the store and the model.
pub fn run_model_check(factory: Arc<dyn StoreFactory>, cases: u32) {
    let cases = std::env::var("LEASE_MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let store = runtime.block_on(factory.fresh());
    let timing = crate::TimingOf::timing(&store.capabilities());
    let next = std::sync::atomic::AtomicU64::new(0);
    let config = ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let started = std::time::Instant::now();
    proptest!(config, |(steps in sequences())| {
        let case = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        runtime.block_on(check_sequence_with(&*store, timing, case, &steps));
    });
    eprintln!(
        "model check: {cases} sequences ({} runs of the store) against {store} in {:.1?}",
        next.load(std::sync::atomic::Ordering::Relaxed),
        started.elapsed()
    );
}
