//! The protocol checked over every interleaving of the small model, then broken on purpose:
//! the checker must find a counterexample for each flaw.

use std::time::Instant;

use lease_model::{Flaw, LeaseModel};
use stateright::{Checker, HasDiscoveries, Model};

const SAFETY: [&str; 6] = [
    "fences never repeat",
    "no write under an older fence is accepted after a newer one",
    "one worker's writes per fence",
    "a completed run completes once",
    "a suspended run is never renewed",
    "at most one worker works on the run at a time",
];

const REACHABLE: [&str; 4] = [
    "a run is reclaimed under a higher fence",
    "a stale write is refused",
    "a run is completed",
    "a suspended run is resumed and reclaimed",
];

#[test]
fn the_protocol_holds_in_every_interleaving() {
    let model = LeaseModel::small();
    let started = Instant::now();
    let checker = model.clone().checker().threads(2).spawn_bfs().join();
    assert!(checker.is_done(), "the whole state space was explored");
    eprintln!(
        "lease-model: {model:?}\n  {} states ({} unique), max depth {}, in {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    for property in SAFETY {
        checker.assert_no_discovery(property);
    }
    // Not vacuous: the schedules the safety properties are about do happen in the model.
    for property in REACHABLE {
        let path = checker.assert_any_discovery(property);
        eprintln!(
            "  reached {property:?} in {} steps",
            path.into_actions().len()
        );
    }
}

/// Checks `flaw` and returns the counterexample for `property`, printed as its actions.
fn counterexample(flaw: Flaw, property: &'static str) -> String {
    counterexample_in(LeaseModel::small(), flaw, property)
}

/// As [`counterexample`], in `model`.
fn counterexample_in(model: LeaseModel, flaw: Flaw, property: &'static str) -> String {
    // Breadth first, stopping at the first counterexample: the shortest schedule that fails.
    let checker = model
        .with_flaw(flaw)
        .checker()
        .finish_when(HasDiscoveries::AnyOf([property].into()))
        .spawn_bfs()
        .join();
    let path = checker.assert_any_discovery(property);
    let steps: Vec<String> = path
        .into_actions()
        .iter()
        .map(|a| format!("{a:?}"))
        .collect();
    let line = format!("{flaw:?} breaks {property:?}: {}", steps.join(" → "));
    eprintln!("{line}");
    line
}

/// The rest of a run's life: workers may also give the run back with a retry delay or fail
/// it, and an operator resume a failed run. Every safety property still holds, a delayed run
/// is never claimed inside its delay, and the new schedules are reached.
#[test]
fn the_life_of_a_run_holds_in_every_interleaving() {
    let model = LeaseModel::life();
    let started = Instant::now();
    let checker = model.clone().checker().threads(2).spawn_bfs().join();
    assert!(checker.is_done(), "the whole state space was explored");
    eprintln!(
        "lease-model (life): {model:?}\n  {} states ({} unique), max depth {}, in {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    for property in SAFETY
        .iter()
        .chain(&["no claim takes a run inside its retry delay"])
    {
        checker.assert_no_discovery(property);
    }
    for property in [
        "a run is reclaimed under a higher fence",
        "a run is completed",
        "a suspended run is resumed and reclaimed",
        "a run given back with a delay is claimed after it",
        "a failed run is resumed and reclaimed",
    ] {
        let path = checker.assert_any_discovery(property);
        eprintln!(
            "  reached {property:?} in {} steps",
            path.into_actions().len()
        );
    }
}

/// An operator may cancel the run once, at any point: every safety property still holds,
/// nothing under a fence is accepted after the cancel, a cancelled run is never claimed, and a
/// holder whose run was cancelled is refused (the model reaches it).
#[test]
fn a_cancel_fences_out_the_holder_in_every_interleaving() {
    let model = LeaseModel::cancel();
    let started = Instant::now();
    let checker = model.clone().checker().threads(2).spawn_bfs().join();
    assert!(checker.is_done(), "the whole state space was explored");
    eprintln!(
        "lease-model (cancel): {model:?}\n  {} states ({} unique), max depth {}, in {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    for property in SAFETY.iter().chain(&[
        "nothing under a fence is accepted after a cancel",
        "a cancelled run is never claimed",
    ]) {
        checker.assert_no_discovery(property);
    }
    for property in [
        "a holder is refused after its run was cancelled",
        "a run is completed",
    ] {
        let path = checker.assert_any_discovery(property);
        eprintln!(
            "  reached {property:?} in {} steps",
            path.into_actions().len()
        );
    }
}

/// A cancel flag beside the lease, as a hand-built job layer has: the holder's writes land
/// after the cancel.
#[test]
fn a_cancel_that_does_not_fence_the_holder_is_found() {
    counterexample_in(
        LeaseModel::cancel(),
        Flaw::CancelKeepsHolder,
        "nothing under a fence is accepted after a cancel",
    );
}

#[test]
fn a_claim_that_ignores_the_retry_delay_is_found() {
    counterexample_in(
        LeaseModel::life(),
        Flaw::ClaimIgnoresDelay,
        "no claim takes a run inside its retry delay",
    );
}

#[test]
fn accepting_a_lower_fence_lets_a_stale_write_land_after_a_newer_one() {
    counterexample(
        Flaw::AcceptLowerFence,
        "no write under an older fence is accepted after a newer one",
    );
}

#[test]
fn renewing_by_fence_alone_renews_a_suspended_run() {
    counterexample(Flaw::RenewSuspended, "a suspended run is never renewed");
}

#[test]
fn a_fence_per_worker_repeats_and_lets_two_workers_write_under_one_fence() {
    counterexample(Flaw::PerWorkerFence, "fences never repeat");
    counterexample(Flaw::PerWorkerFence, "one worker's writes per fence");
}

#[test]
fn a_deadline_from_the_reply_lets_two_workers_work_at_once() {
    counterexample(
        Flaw::DeadlineFromReceipt,
        "at most one worker works on the run at a time",
    );
}

#[test]
fn every_flaw_keeps_the_other_checks_meaningful() {
    // The flawed models still reach the ordinary schedules: a counterexample above is found
    // in a model that works, not in one that does nothing.
    for flaw in [
        Flaw::AcceptLowerFence,
        Flaw::RenewSuspended,
        Flaw::PerWorkerFence,
        Flaw::DeadlineFromReceipt,
    ] {
        let checker = LeaseModel::small()
            .with_flaw(flaw)
            .checker()
            .finish_when(HasDiscoveries::AnyOf(["a run is completed"].into()))
            .spawn_bfs()
            .join();
        checker.assert_any_discovery("a run is completed");
    }
}

/// The attempt budget: workers whose handlers crash (their leases expire unended) or give the
/// run back voluntarily. No run is worked on more than `max_attempts` times since its last
/// resume unless attempts ended voluntarily (a crash counts, a release does not), every other
/// safety property holds, and the schedules that matter are reached: a run whose attempts
/// vanish is failed by the claim past its budget, and a voluntary release gives its attempt
/// back.
#[test]
fn the_attempt_budget_holds_in_every_interleaving() {
    let model = LeaseModel::budget();
    let started = Instant::now();
    let checker = model.clone().checker().threads(2).spawn_bfs().join();
    assert!(checker.is_done(), "the whole state space was explored");
    eprintln!(
        "lease-model (budget): {model:?}\n  {} states ({} unique), max depth {}, in {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    for property in SAFETY.iter().chain(&[
        "no run is worked on more than its budget allows, unless attempts ended voluntarily",
    ]) {
        checker.assert_no_discovery(property);
    }
    for property in [
        "a run is reclaimed under a higher fence",
        "a run whose attempts vanish is failed by its budget",
        "a voluntary release gives its attempt back",
    ] {
        let path = checker.assert_any_discovery(property);
        eprintln!(
            "  reached {property:?} in {} steps",
            path.into_actions().len()
        );
    }
}

/// A budget checked only when a handler returns an error never stops a handler that crashes:
/// its leases expire without an error, and the run is worked on past its budget.
#[test]
fn a_budget_checked_only_on_handler_error_is_found() {
    counterexample_in(
        LeaseModel::budget(),
        Flaw::BudgetOnlyOnError,
        "no run is worked on more than its budget allows, unless attempts ended voluntarily",
    );
}
