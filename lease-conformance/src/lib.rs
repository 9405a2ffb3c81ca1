//! The scenarios every `LeaseStore` backend must pass, and the server fixtures tests share.
//!
//! Each scenario is a plain `pub async fn` taking a [`StoreFactory`], documented by one sentence
//! of expected behaviour, and asserting the *reason* of every rejection. [`conformance_tests!`]
//! expands to one named `#[tokio::test]` per scenario, so a backend's test file is one line:
//!
//! ```ignore
//! lease_conformance::conformance_tests!(lease_conformance::fixtures::memory());
//! ```
//!
//! Passing every scenario is the definition of a correct backend.

use std::sync::Arc;

use lease_core::{Error, LeaseStore};

pub mod acked_scenarios;
mod batch_scenarios;
mod budget_scenarios;
mod capabilities;
mod fault_scenarios;
pub mod fixtures;
pub mod fuzz;
mod history_scenarios;
mod hub_scenarios;
mod job_scenarios;
mod kind_scenarios;
mod lag_scenarios;
mod life_scenarios;
mod machine_scenarios;
pub mod model_check;
mod payload_scenarios;
mod priority_scenarios;
mod queue_scenarios;
mod request_scenarios;
mod retention_scenarios;
mod run_at_scenarios;
mod safety_scenarios;
mod scenarios;
mod scope_scenarios;
mod signal_scenarios;
mod storage_scenarios;
mod time_scenarios;
mod trace_scenarios;
mod unique_scenarios;
mod wake_scenarios;
mod worker_scenarios;

pub use batch_scenarios::*;
pub use budget_scenarios::*;
pub use capabilities::{Capabilities, Timing, TimingOf, MAX_MIN_TTL};
pub use fault_scenarios::*;
pub use history_scenarios::*;
pub use hub_scenarios::*;
pub use job_scenarios::*;
pub use kind_scenarios::*;
pub use lag_scenarios::*;
pub use life_scenarios::*;
pub use machine_scenarios::*;
pub use payload_scenarios::*;
pub use priority_scenarios::*;
pub use queue_scenarios::*;
pub use request_scenarios::*;
pub use retention_scenarios::*;
pub use run_at_scenarios::*;
pub use safety_scenarios::*;
pub use scenarios::*;
pub use scope_scenarios::*;
pub use signal_scenarios::*;
pub use storage_scenarios::{
    a_churned_id_comes_back_above_its_fence, churn_and_purge, churn_in_batches, Churned,
};
pub use time_scenarios::*;
pub use trace_scenarios::*;
pub use unique_scenarios::*;
pub use wake_scenarios::*;
pub use worker_scenarios::*;

/// Asserts `err` says the `backend` server could not be reached: [`Error::Unavailable`] from
/// that backend, and retryable. For adapter tests that take their server away.
///
/// # Panics
/// When it is anything else.
#[track_caller]
pub fn assert_unavailable(err: &Error, backend: &str) {
    assert!(
        matches!(err, Error::Unavailable { backend: b, .. } if *b == backend),
        "expected {backend} to be unavailable, got {err:?}"
    );
    assert!(err.is_retryable(), "{err:?}");
}

/// Hands out fresh stores for scenarios.
#[async_trait::async_trait]
pub trait StoreFactory: Send + Sync {
    /// A store over its own empty namespace: no runs, and nothing another store from this
    /// factory does is visible to it.
    async fn fresh(&self) -> Arc<dyn LeaseStore>;
}

/// The scenario timings for `store`, from what it says it can time
/// ([`LeaseStore::capabilities`]).
pub(crate) fn timing(store: &dyn LeaseStore) -> Timing {
    store.capabilities().timing()
}

/// Waits until the lease on `run`, claimed under [`Timing::short_ttl`] just before, has expired
/// on the store: [`Timing::past_short`], then, on a store that needs longer (etcd revokes a lease
/// later under a slow disk), inspects until the record says so, for at most as long again.
/// Fails the test if the lease has still not expired.
pub(crate) async fn until_expired(
    store: &dyn lease_core::LeaseStore,
    run: &lease_core::RunId,
    t: Timing,
) {
    tokio::time::sleep(t.past_short()).await;
    let deadline = std::time::Instant::now() + t.past_short();
    loop {
        let record = store.inspect(run).await.expect("inspect");
        if record.is_expired() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{run} has not expired {:?} after a claim under {:?}: {record:?}",
            t.past_short() * 2,
            t.short_ttl().as_duration()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Expands to the ignored benchmark tests of a run's life against a store from `$factory` (as
/// for [`conformance_tests!`]): the purge under renewals ([`purge_under_load`]), `count` over a
/// million runs ([`count_at_scale`]) and a poison
/// run's claim rate ([`poison_claim_rate`]). Run with `--release -- --ignored --nocapture`.
#[macro_export]
macro_rules! life_benchmarks {
    ($factory:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[ignore = "a benchmark: run with --ignored --release"]
        async fn purging_100_000_runs_while_1_000_leases_are_renewed() {
            let Some(factory) = $factory.await else {
                return;
            };
            let line = $crate::purge_under_load(factory.fresh().await).await;
            eprintln!("purge_load: {line}");
        }
        /// `count` with the queue's lag over a million runs ([`count_at_scale`]).
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[ignore = "a benchmark: run with --ignored --release"]
        async fn count_with_the_queue_lag_on_a_million_runs() {
            let Some(factory) = $factory.await else {
                return;
            };
            let line = $crate::count_at_scale(factory.fresh().await).await;
            eprintln!("count_scale: {line}");
        }

        /// A run whose handler crashes its process on every claim, and one whose handler
        /// hangs, each over a minute: claims without a budget (or a deadline) against claims
        /// with the default policy's budget (and a 1 s attempt deadline).
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[ignore = "a benchmark: run with --ignored --release"]
        async fn crash_and_hang_poison_runs_over_a_minute() {
            use std::time::Duration;
            let Some(factory) = $factory.await else {
                return;
            };
            let minute = Duration::from_secs(60);
            let ttl = lease_core::Ttl::from_secs(1).unwrap();
            let unbounded = lease_runtime::RetryPolicy::default().without_max_attempts();
            let budget = lease_runtime::RetryPolicy::default().with_max_attempts(3);
            for (name, policy) in [("no budget", unbounded), ("max_attempts 3", budget)] {
                let (claims, starts, state) =
                    $crate::crash_poison_claims(factory.fresh().await, ttl, policy, minute).await;
                eprintln!(
                    "crash poison, TTL 1 s, {name}: {claims} claims in a minute, the handler \
                     started {starts} times, the run ends {state}"
                );
            }
            for (name, policy, deadline) in [
                ("no deadline", budget, None),
                (
                    "1 s deadline, max_attempts 3",
                    budget,
                    Some(Duration::from_secs(1)),
                ),
            ] {
                let (claims, state) =
                    $crate::hang_poison_claims(factory.fresh().await, policy, deadline, minute)
                        .await;
                eprintln!("hang poison, {name}: {claims} claims in a minute, the run is {state}");
            }
        }

        /// A poison run's claims per second: released at once (the Worker before retry
        /// policies) against the default retry policy.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[ignore = "a benchmark: run with --ignored --release"]
        async fn a_poison_run_is_claimed_again_at_once_without_backoff() {
            use std::time::Duration;
            let Some(factory) = $factory.await else {
                return;
            };
            let window = Duration::from_secs(3);
            let at_once = lease_runtime::RetryPolicy::default()
                .with_backoff(Duration::ZERO, Duration::ZERO)
                .without_max_attempts();
            let before = $crate::poison_claim_rate(factory.fresh().await, at_once, window).await;
            let after = $crate::poison_claim_rate(
                factory.fresh().await,
                lease_runtime::RetryPolicy::default(),
                window,
            )
            .await;
            eprintln!(
                "poison run, claims per second over {window:?}: released at once {before:.0}, \
                 default retry policy {after:.2}"
            );
        }
    };
}

/// Expands to one `#[tokio::test]` per store scenario, each running against a store from
/// `$factory`: an expression evaluating to a future of `Option<Arc<dyn StoreFactory>>`, where
/// `None` means the backend's server is unavailable and the fixture already said why (outside CI).
///
/// The store scenarios are every rule a backend implements. The runtime built on the trait
/// (`RunScope`, the heartbeat hub, the Worker's slots, deadlines and shutdown) is the same code
/// whatever the store, so its scenarios run once, in [`runtime_tests!`] on the memory store
/// under Tokio's paused clock; here one of them,
/// [`scope_heartbeats_keep_a_lease_past_its_ttl`], stays as a real-time smoke of heartbeats
/// against the backend's own clock.
#[macro_export]
macro_rules! conformance_tests {
    ($factory:expr) => {
        $crate::conformance_tests!(@each $factory;
            claim_of_a_fresh_run_returns_fence_one,
            a_held_run_is_refused_with_its_holder,
            an_expired_lease_is_reclaimable_with_the_next_fence,
            a_write_under_a_lower_fence_is_rejected_with_both_fences,
            a_write_under_the_current_fence_after_expiry_is_accepted,
            a_fence_the_store_never_issued_is_rejected_as_ahead,
            renew_extends_expiry_and_counts_heartbeats,
            renew_under_a_stale_fence_is_rejected,
            release_makes_the_run_claimable_and_fences_out_the_old_lease,
            suspend_clears_the_owner_blocks_claims_and_stops_heartbeats,
            resume_then_claim_takes_a_higher_fence,
            fences_strictly_increase_over_a_hundred_claim_expire_cycles,
            concurrent_claims_of_one_run_have_exactly_one_winner,
            claim_next_never_hands_out_a_run_twice,
            claim_next_takes_claimable_runs_longest_waiting_first,
            complete_is_terminal_and_fenced,
            journal_entries_keep_order_and_record_their_fence,
            renew_many_reports_a_result_per_lease,
            bad_input_is_refused_and_changes_nothing,
            unknown_runs_are_not_found,
            create_twice_is_refused,
            hostile_run_ids_are_stored_verbatim,
            list_filters_by_state_and_expiry,
            force_release_hands_the_run_over_under_a_higher_fence,
            end_many_ends_each_lease_as_asked_with_a_verdict_per_item,
            complete_with_writes_its_effect_only_with_the_completion,
            a_retried_end_many_answers_lease_ended_with_its_own_fence,
            end_many_refuses_a_bad_batch_and_changes_nothing,
            full_batches_of_ends_commit_every_item,
            end_many_refuses_a_batch_whose_effects_are_too_large_together,
            create_many_refuses_existing_ids_alone_and_keeps_order,
            a_keyed_append_applies_once_per_key,
            inspect_many_answers_each_run_in_order,
            a_retry_delay_holds_the_run_back_on_the_store_clock,
            a_failed_run_stays_failed_until_an_operator_resumes_it,
            purge_removes_old_ended_runs_and_never_reuses_a_fence,
            a_purged_id_created_again_refuses_every_lease_of_its_old_life,
            purge_racing_creates_never_reissues_a_fence,
            a_failure_reason_with_a_control_character_is_refused_before_any_io,
            the_attempt_budget_counts_failures_not_waits_deploys_or_snoozes,
            an_end_the_handler_committed_is_reported_once_after_a_renewal_met_it,
            count_tells_how_many_runs_are_in_each_state,
            count_tells_the_queue_lag_on_the_store_clock,
            records_tell_since_when_a_run_has_been_claimable,
            count_tells_the_longest_held_lease,
            count_kinds_tells_each_kinds_waiting_runs_and_lag,
            claim_next_tells_how_long_each_run_waited,
            times_on_the_record_follow_the_life_on_the_store_clock,
            the_attempt_history_tells_how_each_attempt_ended,
            the_attempt_history_is_bounded_and_goes_with_its_run,
            cancel_ends_a_run_in_every_state_but_completed,
            cancel_fences_out_the_holder_with_a_verdict_naming_it,
            a_cancel_racing_the_holders_end_has_exactly_one_winner,
            purge_removes_cancelled_runs_and_never_reuses_their_fence,
            a_run_created_with_a_delay_waits_for_it_on_the_store_clock,
            a_run_created_for_a_wall_time_waits_for_it_on_the_store_clock,
            a_payload_round_trips_byte_exact_from_create_to_every_claim,
            a_payload_is_immutable_and_goes_with_its_run,
            a_runs_trace_parent_goes_from_its_create_to_every_claim,
            a_worker_hands_each_handler_its_runs_payload,
            runs_are_claimed_only_by_a_claim_of_their_kind,
            by_id_calls_and_mislabelled_leases_keep_a_run_in_its_kind,
            higher_priorities_are_claimed_first_and_the_oldest_first_within_one,
            a_unique_key_keeps_one_live_run,
            queues_are_claimed_apart_and_a_paused_one_by_no_one,
            a_signal_answers_its_wait_once_under_a_higher_fence,
            a_wait_times_out_on_the_store_clock_and_refuses_a_late_signal,
            a_signal_racing_a_timeout_or_a_cancel_has_exactly_one_winner,
            a_waiting_run_is_resumed_cancelled_or_purged_and_its_token_goes_stale,
            a_signal_that_comes_before_its_wait_is_stored_answers_it,
            a_worker_serves_each_kind_with_its_handler_and_starves_none,
            worker_handler_ignoring_its_token_is_still_fenced,
            worker_reports_no_end_before_its_batch_commits,
            wake_ups_come_when_a_run_becomes_claimable,
            an_idle_worker_is_woken_by_a_new_run_not_by_its_poll,
            resuming_a_queue_wakes_the_workers_of_its_kinds,
            workers_with_retention_purge_ended_runs_under_one_lease,
            purge_ended_removes_only_the_states_asked,
            purge_ids_removes_the_listed_ended_runs_only,
            scope_heartbeats_keep_a_lease_past_its_ttl,
            the_machine_table_holds_on_every_backend,
        );
    };
    (@each $factory:expr; $($scenario:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                let Some(factory) = $factory.await else { return };
                $crate::$scenario(&*factory).await;
            }
        )*
    };
}

/// Expands to one `#[tokio::test(start_paused = true)]` per runtime scenario: `RunScope`, the
/// heartbeat hub, and the Worker's slots, attempt deadlines, budgets and shutdown, each against a
/// store from `$factory` (as for [`conformance_tests!`]). The runtime is the same code over
/// every backend, so these run once, over the memory store, whose clock is Tokio's: with the
/// clock paused, a scenario's seconds of TTLs, deadlines and heartbeats pass as fast as the
/// runtime can do its work, and no margin depends on the machine's speed. The calling crate
/// needs Tokio's `test-util` feature (a paused clock).
///
/// ```ignore
/// lease_conformance::runtime_tests!(lease_conformance::fixtures::memory());
/// ```
#[macro_export]
macro_rules! runtime_tests {
    ($factory:expr) => {
        $crate::runtime_tests!(@each $factory;
            a_handler_that_crashes_every_attempt_fails_the_run_after_its_budget,
            a_handler_that_hangs_fails_after_its_attempt_deadlines,
            a_scope_fails_a_run_claimed_past_its_budget,
            a_worker_escapes_control_characters_in_the_reasons_it_records,
            worker_gives_up_on_a_poison_run_after_its_attempts,
            worker_runs_at_most_its_concurrency_limit,
            worker_shutdown_hands_runs_over_within_one_poll,
            a_worker_handler_waits_for_a_signal_and_resumes_with_it,
            scope_over_a_hanging_store_cancels_at_its_local_deadline_before_store_expiry,
            scope_whose_renewal_is_rejected_cancels_with_the_rejection,
            scope_suspend_stops_heartbeats,
            scope_timing_without_room_for_a_retry_is_refused,
            scope_after_a_slow_renewal_still_has_time_to_retry,
            scope_end_retried_after_a_lost_answer_succeeds,
            hub_cancels_only_the_scope_whose_lease_is_stale,
            hub_over_a_hanging_store_cancels_every_scope_at_its_local_deadline,
            hub_renews_in_chunks_of_at_most_max_batch,
            heartbeats_stop_once_a_lease_ends,
            scope_deadline_counts_from_the_send_instant_of_a_late_renewal,
            scope_heartbeats_keep_a_lease_past_its_ttl,
        );
    };
    (@each $factory:expr; $($scenario:ident),* $(,)?) => {
        $(
            #[tokio::test(start_paused = true)]
            async fn $scenario() {
                let Some(factory) = $factory.await else { return };
                $crate::$scenario(&*factory).await;
            }
        )*
    };
}
