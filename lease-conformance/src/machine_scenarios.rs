//! The machine table: the same transitions through the store and through
//! [`lease_core::machine::step`], each verdict (by its reason) and each record compared with
//! the machine's. A backend whose SQL, Lua or transactions drift from the one written rule
//! fails here, at the step where they part.

use std::time::Duration;

use lease_core::machine::{self, Op};
use lease_core::{
    AttemptOutcome, End, Error, Fence, Kind, Lease, NewRun, RunRecord, StoreTime, Ttl,
};

use crate::scenarios::{long, run, worker};
use crate::{timing, until_expired, StoreFactory};

/// One step of a row.
#[derive(Clone, Debug)]
enum Do {
    /// A claim by this worker under a long TTL.
    Claim(&'static str),
    /// A claim by this worker under the short TTL (an `Expire` follows).
    ClaimShort(&'static str),
    /// Wait until the current lease has expired on the store.
    Expire,
    /// Renew the current lease.
    Renew,
    /// Append an entry under the current lease.
    Append,
    /// Append under the lease before the current one.
    AppendStale,
    /// Append under a fence the store never issued (the current one + 5).
    AppendAhead,
    /// End the current lease.
    End(End),
    ForceRelease,
    Cancel(&'static str),
    Resume,
}

/// The rows: each a run's life from its creation.
fn table() -> Vec<Vec<Do>> {
    use Do::*;
    let hour = Duration::from_secs(3600);
    vec![
        // Held, renewed, written, completed; then every operation on a completed run.
        vec![
            Claim("a"),
            Claim("b"),
            Renew,
            Append,
            End(lease_core::End::Complete),
            Append,
            Claim("b"),
            Resume,
            Cancel("late"),
            ForceRelease,
        ],
        // An expired lease taken over; the old holder fenced out; a release refunds.
        vec![
            ClaimShort("a"),
            Expire,
            Claim("b"),
            AppendStale,
            AppendAhead,
            End(lease_core::End::Release),
            Claim("a"),
        ],
        // A failed attempt counts and delays; force-release ends the delay.
        vec![
            Claim("a"),
            End(lease_core::End::AttemptFailed {
                retry_after: hour,
                reason: "boom".into(),
            }),
            Claim("b"),
            ForceRelease,
            Claim("b"),
        ],
        // A snooze refunds and delays.
        vec![
            Claim("a"),
            End(lease_core::End::RetryAfter(hour)),
            Claim("a"),
            Cancel("not wanted"),
            Cancel("not wanted"),
            Resume,
        ],
        // Suspend, resume with a fresh budget.
        vec![
            Claim("a"),
            End(lease_core::End::Suspend),
            Claim("b"),
            Append,
            Resume,
            Claim("b"),
        ],
        // Fail, resume, cancel while held.
        vec![
            Claim("a"),
            End(lease_core::End::Fail("gave up".into())),
            Claim("b"),
            Resume,
            Claim("b"),
            Cancel("operator"),
            Append,
            Resume,
        ],
        // An effect with its completion; the same end again is told it ended.
        vec![
            Claim("a"),
            End(lease_core::End::CompleteWith(b"effect".to_vec())),
            End(lease_core::End::CompleteWith(b"effect".to_vec())),
        ],
        // A force-release of a held run.
        vec![Claim("a"), ForceRelease, Append, Claim("b"), Renew],
    ]
}

/// A verdict by its reason: the variant and the fields every backend must agree on.
fn reason<T>(result: &lease_core::Result<T>) -> String {
    let Err(e) = result else {
        return "ok".into();
    };
    match e {
        Error::StaleFence {
            presented, current, ..
        } => format!("stale {presented} < {current}"),
        Error::FenceAhead {
            presented, current, ..
        } => format!("ahead {presented} > {current}"),
        Error::LeaseEnded { fence, ended, .. } => format!("ended {fence} {ended:?}"),
        Error::Held { owner, .. } => format!("held by {owner}"),
        Error::Delayed { .. } => "delayed".into(),
        Error::Suspended { .. } => "suspended".into(),
        Error::Completed { .. } => "completed".into(),
        Error::Failed { .. } => "failed".into(),
        Error::Cancelled { .. } => "cancelled".into(),
        Error::NotSuspended { state, .. } => format!("not suspended: {state:?}"),
        Error::FenceExhausted { .. } => "fence exhausted".into(),
        other => format!("{other:?}"),
    }
}

/// What is compared of a record: state, fence, holder, budget, renewals, reason, whether it
/// waits out a delay, and (where the store keeps one) each attempt's outcome, fence, worker,
/// number and error.
type Compared = (
    String,
    u64,
    Option<String>,
    u64,
    u64,
    Option<String>,
    bool,
    Option<Vec<(AttemptOutcome, u64, String, u64, Option<String>)>>,
);

fn compared(record: &RunRecord, history: bool) -> Compared {
    (
        format!("{:?}", record.state),
        record.fence.get(),
        record.owner.as_ref().map(ToString::to_string),
        record.attempts,
        record.heartbeats,
        record.failure.clone(),
        record.not_before.is_some(),
        history.then(|| {
            record
                .history
                .iter()
                .flatten()
                .map(|a| {
                    let worker = a.worker.to_string();
                    (a.outcome, a.fence.get(), worker, a.attempt, a.error.clone())
                })
                .collect()
        }),
    )
}

/// Every row of the table, through the store and the machine side by side: after each step
/// the store's verdict has the machine's reason and its record the machine's state, fence,
/// holder, budget, renewals, reason, delay and history; the journal has as many entries as
/// the machine let through.
pub async fn the_machine_table_holds_on_every_backend(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let t = timing(&*store);
    let history = store.capabilities().attempt_history;
    for (row, steps) in table().into_iter().enumerate() {
        let id = run(&format!("machine-row-{row}"));
        store
            .create_with(&NewRun::new(id.clone()))
            .await
            .expect("create");
        // The machine's clock: only differences matter, as for the store's.
        let mut now = StoreTime::from_micros(1_000_000);
        let mut model = machine::Run::created(Kind::default(), 0, Fence::ZERO, now, now);
        let mut journal = 0;
        let mut leases: Vec<(Lease, Ttl)> = Vec::new();
        for (i, step) in steps.iter().enumerate() {
            now = StoreTime::from_micros(now.as_micros() + 1_000);
            let at = format!("row {row} step {i} {step:?}");
            let (got, want) = match step {
                Do::Claim(w) | Do::ClaimShort(w) => {
                    let ttl = match step {
                        Do::Claim(_) => long(),
                        _ => t.short_ttl(),
                    };
                    let w = worker(w);
                    let got = store.claim(&id, &w, ttl).await;
                    let op = Op::Claim { worker: &w, ttl };
                    let want = machine::step(&id, &mut model, op, now).map(|_| ());
                    if let Ok(lease) = &got {
                        leases.push((lease.clone(), ttl));
                    }
                    (reason(&got), reason(&want))
                }
                Do::Expire => {
                    let (_, ttl) = leases.last().expect("a lease to expire");
                    until_expired(&*store, &id, t).await;
                    now = StoreTime::from_micros(
                        now.as_micros() + ttl.as_millis() * 1000 + 1_000_000,
                    );
                    continue;
                }
                Do::Renew => {
                    let (lease, ttl) = leases.last().expect("a lease").clone();
                    let got = store.renew(&lease).await;
                    let op = Op::Renew { lease: &lease, ttl };
                    let want = machine::step(&id, &mut model, op, now).map(|_| ());
                    (reason(&got), reason(&want))
                }
                Do::Append | Do::AppendStale | Do::AppendAhead => {
                    let lease = match step {
                        Do::Append => leases.last().expect("a lease").0.clone(),
                        Do::AppendStale => leases[leases.len() - 2].0.clone(),
                        _ => {
                            let current = &leases.last().expect("a lease").0;
                            let forged = Fence::new(current.fence().get() + 5).expect("a fence");
                            Lease::new(
                                id.clone(),
                                current.owner().clone(),
                                forged,
                                current.ttl(),
                                current.expires_at(),
                            )
                            .expect("a lease")
                        }
                    };
                    let got = store.append(&lease, b"entry").await;
                    let want = machine::step(&id, &mut model, Op::Write { lease: &lease }, now);
                    journal += usize::from(want.is_ok());
                    (reason(&got), reason(&want))
                }
                Do::End(end) => {
                    let (lease, _) = leases.last().expect("a lease").clone();
                    let got = store
                        .end_many(&[lease_core::Ending::new(lease.clone(), end.clone())])
                        .await
                        .expect("end_many answers")
                        .pop()
                        .expect("one verdict");
                    let op = Op::End { lease: &lease, end };
                    let want = machine::step(&id, &mut model, op, now);
                    if let Ok(machine::Applied::Ended { journal: Some(_) }) = want {
                        journal += 1;
                    }
                    (reason(&got), reason(&want))
                }
                Do::ForceRelease => {
                    let got = store.force_release(&id).await;
                    let want = machine::step(&id, &mut model, Op::ForceRelease, now);
                    (reason(&got), reason(&want))
                }
                Do::Cancel(why) => {
                    let got = store.cancel(&id, why).await;
                    let want = machine::step(&id, &mut model, Op::Cancel { reason: why }, now);
                    (reason(&got), reason(&want))
                }
                Do::Resume => {
                    let got = store.resume(&id).await;
                    let want = machine::step(&id, &mut model, Op::Resume, now);
                    (reason(&got), reason(&want))
                }
            };
            assert_eq!(got, want, "{at}: the store's verdict is not the machine's");
            let record = store.inspect(&id).await.expect("inspect");
            let expected = model
                .record(&id, now)
                .with_history(model.history.iter().cloned().collect());
            assert_eq!(
                compared(&record, history),
                compared(&expected, history),
                "{at}: the store's record is not the machine's\nstore:   {record:?}\nmachine: {expected:?}"
            );
            let entries = store.journal(&id).await.expect("journal").len();
            assert_eq!(entries, journal, "{at}: journal entries");
        }
    }
}
