//! The transitions, one by one: each verdict by its reason, and a refusal changes nothing.

use super::*;
use crate::Ended;

fn t(ms: u64) -> StoreTime {
    StoreTime::from_micros(ms * 1000)
}

fn id() -> RunId {
    RunId::new("machine-run").unwrap()
}

fn w(name: &str) -> WorkerId {
    WorkerId::new(name).unwrap()
}

fn ttl(ms: u64) -> Ttl {
    Ttl::from_millis(ms).unwrap()
}

fn fresh() -> Run {
    Run::created(Kind::default(), 0, Fence::ZERO, t(0), t(0))
}

/// `run` claimed by `worker` at `at` for 100 ms, and its lease.
fn claimed(run: &mut Run, worker: &str, at: u64) -> Lease {
    let worker = w(worker);
    step(
        &id(),
        run,
        Op::Claim {
            worker: &worker,
            ttl: ttl(100),
        },
        t(at),
    )
    .unwrap();
    run.lease(&id(), ttl(100)).unwrap()
}

/// Asserts `op` is refused at `at` with an error `is` accepts, and leaves `run` as it was.
fn refused(run: &mut Run, op: Op<'_>, at: u64, is: impl Fn(&Error) -> bool) {
    let before = run.clone();
    let err = step(&id(), run, op, t(at)).unwrap_err();
    assert!(is(&err), "unexpected refusal: {err:?}");
    assert_eq!(*run, before, "a refusal changed the run");
}

#[test]
fn a_claim_raises_the_fence_counts_the_attempt_and_refuses_a_second_claimant() {
    let mut run = fresh();
    let lease = claimed(&mut run, "a", 10);
    assert_eq!(lease.fence().get(), 1);
    assert_eq!(run.attempts, 1);
    assert_eq!(run.expires_at, Some(t(110)));
    assert_eq!(run.claimed_at, Some(t(10)));
    let b = w("b");
    let op = Op::Claim {
        worker: &b,
        ttl: ttl(100),
    };
    refused(
        &mut run,
        op,
        50,
        |e| matches!(e, Error::Held { owner, remaining, .. } if owner.as_str() == "a" && *remaining == Duration::from_millis(60)),
    );
}

#[test]
fn an_expired_lease_is_taken_over_and_its_attempt_archived_at_its_expiry() {
    let mut run = fresh();
    let old = claimed(&mut run, "a", 0);
    let worker = w("b");
    let applied = step(
        &id(),
        &mut run,
        Op::Claim {
            worker: &worker,
            ttl: ttl(100),
        },
        t(150),
    )
    .unwrap();
    assert_eq!(
        applied,
        Applied::Claimed {
            waited: Duration::from_millis(50)
        }
    );
    assert_eq!(run.fence.get(), 2);
    assert_eq!(run.attempts, 2);
    let archived = run.history.back().unwrap();
    assert_eq!(archived.outcome, AttemptOutcome::Expired);
    assert_eq!(archived.ended_at, Some(t(100)));
    assert_eq!(archived.fence.get(), 1);
    // The old holder is fenced out: stale, whatever it writes.
    refused(&mut run, Op::Write { lease: &old }, 160, |e| {
        matches!(
            e,
            Error::StaleFence {
                presented: 1,
                current: 2,
                ..
            }
        )
    });
}

#[test]
fn voluntary_ends_refund_the_attempt_and_failures_keep_it() {
    for (end, state, attempts, outcome) in [
        (
            End::Release,
            RunState::Runnable,
            0,
            AttemptOutcome::Released,
        ),
        (
            End::Suspend,
            RunState::Suspended,
            0,
            AttemptOutcome::Suspended,
        ),
        (
            End::RetryAfter(Duration::from_millis(40)),
            RunState::Runnable,
            0,
            AttemptOutcome::Released,
        ),
        (
            End::Complete,
            RunState::Completed,
            1,
            AttemptOutcome::Completed,
        ),
        (
            End::AttemptFailed {
                retry_after: Duration::from_millis(40),
                reason: "boom".into(),
            },
            RunState::Runnable,
            1,
            AttemptOutcome::Retried,
        ),
        (
            End::Fail("gave up".into()),
            RunState::Failed,
            1,
            AttemptOutcome::Failed,
        ),
    ] {
        let mut run = fresh();
        let lease = claimed(&mut run, "a", 0);
        step(
            &id(),
            &mut run,
            Op::End {
                lease: &lease,
                end: &end,
            },
            t(20),
        )
        .unwrap();
        assert_eq!(run.state, state, "{end:?}");
        assert_eq!(run.attempts, attempts, "{end:?}");
        assert_eq!(run.history.back().unwrap().outcome, outcome, "{end:?}");
        assert_eq!(run.owner, None);
        assert_eq!(run.claimable_at, t(20 + end.delay_millis()), "{end:?}");
        // The ended lease writes nothing more, and is told how it ended.
        refused(
            &mut run,
            Op::Write { lease: &lease },
            30,
            |e| matches!(e, Error::LeaseEnded { ended, .. } if *ended == end.ended()),
        );
    }
}

#[test]
fn a_delayed_run_is_refused_until_its_delay_passes() {
    let mut run = fresh();
    let lease = claimed(&mut run, "a", 0);
    let end = End::RetryAfter(Duration::from_millis(50));
    step(
        &id(),
        &mut run,
        Op::End {
            lease: &lease,
            end: &end,
        },
        t(10),
    )
    .unwrap();
    let b = w("b");
    let op = Op::Claim {
        worker: &b,
        ttl: ttl(100),
    };
    refused(
        &mut run,
        op,
        30,
        |e| matches!(e, Error::Delayed { remaining, .. } if *remaining == Duration::from_millis(30)),
    );
    assert!(!run.is_due(t(59)) && run.is_due(t(60)));
    step(&id(), &mut run, op, t(60)).unwrap();
    assert_eq!(run.fence.get(), 2);
}

#[test]
fn complete_with_hands_its_entry_to_the_backend_and_committed_is_refused() {
    let mut run = fresh();
    let lease = claimed(&mut run, "a", 0);
    let committed = End::Committed(Ended::Completed);
    refused(
        &mut run,
        Op::End {
            lease: &lease,
            end: &committed,
        },
        5,
        |e| matches!(e, Error::InvalidInput(InvalidInput::Unsupported { .. })),
    );
    let end = End::CompleteWith(b"effect".to_vec());
    let applied = step(
        &id(),
        &mut run,
        Op::End {
            lease: &lease,
            end: &end,
        },
        t(5),
    )
    .unwrap();
    assert_eq!(
        applied,
        Applied::Ended {
            journal: Some(&b"effect"[..])
        }
    );
}

#[test]
fn terminal_and_suspended_runs_refuse_claims_by_their_state() {
    for (end, named) in [
        (End::Suspend, "suspended"),
        (End::Complete, "completed"),
        (End::Fail("x".into()), "failed"),
    ] {
        let mut run = fresh();
        let lease = claimed(&mut run, "a", 0);
        step(
            &id(),
            &mut run,
            Op::End {
                lease: &lease,
                end: &end,
            },
            t(1),
        )
        .unwrap();
        let b = w("b");
        let op = Op::Claim {
            worker: &b,
            ttl: ttl(100),
        };
        refused(&mut run, op, 2, |e| match named {
            "suspended" => matches!(e, Error::Suspended { .. }),
            "completed" => matches!(e, Error::Completed { .. }),
            _ => matches!(e, Error::Failed { .. }),
        });
    }
}

#[test]
fn force_release_ends_a_live_attempt_now_and_an_expired_one_at_its_expiry() {
    let mut run = fresh();
    claimed(&mut run, "a", 0);
    step(&id(), &mut run, Op::ForceRelease, t(40)).unwrap();
    let last = run.history.back().unwrap();
    assert_eq!(
        (last.outcome, last.ended_at),
        (AttemptOutcome::ForceReleased, Some(t(40)))
    );
    assert!(run.is_due(t(40)));

    let mut run = fresh();
    claimed(&mut run, "a", 0);
    step(&id(), &mut run, Op::ForceRelease, t(400)).unwrap();
    let last = run.history.back().unwrap();
    assert_eq!(
        (last.outcome, last.ended_at),
        (AttemptOutcome::Expired, Some(t(100)))
    );
}

#[test]
fn cancel_is_idempotent_and_fences_the_holder_out() {
    let mut run = fresh();
    let lease = claimed(&mut run, "a", 0);
    let op = Op::Cancel {
        reason: "no longer wanted",
    };
    assert_eq!(step(&id(), &mut run, op, t(5)).unwrap(), Applied::Cancelled);
    assert_eq!(run.failure.as_deref(), Some("no longer wanted"));
    let before = run.clone();
    assert_eq!(
        step(&id(), &mut run, op, t(6)).unwrap(),
        Applied::AlreadyCancelled
    );
    assert_eq!(run, before);
    refused(&mut run, Op::Write { lease: &lease }, 7, |e| {
        matches!(
            e,
            Error::LeaseEnded {
                ended: Ended::Cancelled,
                ..
            }
        )
    });
}

#[test]
fn resume_gives_a_fresh_budget_and_refuses_a_runnable_run() {
    let mut run = fresh();
    let lease = claimed(&mut run, "a", 0);
    refused(&mut run, Op::Resume, 1, |e| {
        matches!(
            e,
            Error::NotSuspended {
                state: RunState::Runnable,
                ..
            }
        )
    });
    let end = End::Fail("x".into());
    step(
        &id(),
        &mut run,
        Op::End {
            lease: &lease,
            end: &end,
        },
        t(2),
    )
    .unwrap();
    step(&id(), &mut run, Op::Resume, t(3)).unwrap();
    assert_eq!(
        (run.state, run.attempts, run.failure.clone()),
        (RunState::Runnable, 0, None)
    );
    assert!(run.is_due(t(3)));
}

#[test]
fn the_history_keeps_the_last_attempts_and_the_fence_stops_at_its_maximum() {
    let mut run = fresh();
    for i in 0..(crate::MAX_HISTORY as u64 + 3) {
        let lease = claimed(&mut run, "a", i * 10);
        step(
            &id(),
            &mut run,
            Op::End {
                lease: &lease,
                end: &End::Release,
            },
            t(i * 10 + 1),
        )
        .unwrap();
    }
    assert_eq!(run.history.len(), crate::MAX_HISTORY);
    assert_eq!(run.history.front().unwrap().fence.get(), 4);

    let mut run = Run::created(Kind::default(), 0, Fence::MAX, t(0), t(0));
    let a = w("a");
    let op = Op::Claim {
        worker: &a,
        ttl: ttl(100),
    };
    refused(&mut run, op, 1, |e| {
        matches!(e, Error::FenceExhausted { .. })
    });
    assert!(!run.is_due(t(1)));
}

#[test]
fn claim_order_puts_priority_before_age() {
    let old_low = Run::created(Kind::default(), 0, Fence::ZERO, t(0), t(0));
    let new_high = Run::created(Kind::default(), 9, Fence::ZERO, t(50), t(50));
    let older_high = Run::created(Kind::default(), 9, Fence::ZERO, t(10), t(10));
    assert!(new_high.claim_order() < old_low.claim_order());
    assert!(older_high.claim_order() < new_high.claim_order());
}

#[test]
fn retention_deletes_only_ended_runs_of_the_states_asked_once_old_enough() {
    let mut run = fresh();
    let lease = claimed(&mut run, "a", 0);
    let day = Duration::from_secs(86_400);
    assert!(!run.purgeable(EndedStates::ALL, Duration::ZERO, t(1)));
    step(
        &id(),
        &mut run,
        Op::End {
            lease: &lease,
            end: &End::Complete,
        },
        t(1),
    )
    .unwrap();
    let later = StoreTime::from_micros(t(1).as_micros() + day.as_micros() as u64);
    assert!(!run.purgeable(EndedStates::ALL, day, t(2)));
    assert!(run.purgeable(EndedStates::ALL, day, later));
    assert!(!run.purgeable(EndedStates::FAILED, day, later));
}
