//! Times on the record: created, claimed, renewed and ended, on the store's clock, in the
//! order a run's life gives them.

use std::time::Duration;

use lease_core::{LeaseStoreExt, ListFilter, RunRecord, RunState, StoreTime};
use tokio::time::{sleep, Instant};

use crate::scenarios::{run, worker};
use crate::StoreFactory;

/// Slack for the rounding of store times to microseconds and of a store's clock readings.
const SLACK: Duration = Duration::from_millis(2);

/// Asserts that `later - earlier`, two store times, lies within what the test's own
/// monotonic clock allows: at least `low` and at most `high` (each ± [`SLACK`]).
#[track_caller]
fn apart(what: &str, earlier: StoreTime, later: StoreTime, low: Duration, high: Duration) {
    assert!(later >= earlier, "{what}: {later:?} before {earlier:?}");
    let gap = later.saturating_since(earlier);
    assert!(
        gap + SLACK >= low && gap <= high + SLACK,
        "{what}: {gap:?} on the store's clock, outside {low:?}..={high:?} by the test's clock"
    );
}

fn times(r: &RunRecord) -> [Option<StoreTime>; 4] {
    [r.created_at, r.claimed_at, r.renewed_at, r.ended_at]
}

/// A run's times follow its life on the store's clock: `created_at` at the create, none
/// else; a claim sets `claimed_at` and clears `renewed_at`; a renewal sets `renewed_at`; an
/// end sets `ended_at` and keeps the claim's time; a resume clears `ended_at`; a cancel of a
/// waiting run sets it. Every gap between two of them matches the time the test measured
/// between the calls, each is at most the record's `observed_at`, and `inspect`,
/// `inspect_many` and `list` agree. A store that keeps no times reports none.
pub async fn times_on_the_record_follow_the_life_on_the_store_clock(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let t = crate::timing(&*store);
    let keeps = store.capabilities().record_times;
    let w = worker("w");
    let pause = t.scale(Duration::from_millis(60));

    let create_sent = Instant::now();
    let created = store.create(&run("timed")).await.unwrap();
    let create_answered = Instant::now();
    if !keeps {
        assert_eq!(times(&created), [None; 4], "a store that keeps no times");
        let held = store
            .claim(&run("timed"), &w, t.at_least(60_000))
            .await
            .unwrap();
        store.complete(&held).await.unwrap();
        let done = store.inspect(&run("timed")).await.unwrap();
        assert_eq!(times(&done), [None; 4], "a store that keeps no times");
        return;
    }
    let created_at = created
        .created_at
        .expect("create returns the creation time");
    assert!(created_at <= created.observed_at, "{created:?}");
    assert_eq!(times(&created)[1..], [None; 3], "a new run: {created:?}");

    sleep(pause).await;
    let claim_sent = Instant::now();
    let lease = store
        .claim(&run("timed"), &w, t.at_least(60_000))
        .await
        .unwrap();
    let claim_answered = Instant::now();
    let held = store.inspect(&run("timed")).await.unwrap();
    let inspected = Instant::now();
    assert_eq!(held.created_at, Some(created_at), "the creation time stays");
    let claimed_at = held.claimed_at.expect("a claim sets claimed_at");
    apart(
        "create to claim",
        created_at,
        claimed_at,
        claim_sent - create_answered,
        claim_answered - create_sent,
    );
    assert_eq!(held.renewed_at, None, "not renewed yet");
    assert_eq!(held.ended_at, None, "not ended");
    apart(
        "claim to the inspect's reading",
        claimed_at,
        held.observed_at,
        Duration::ZERO,
        inspected - claim_sent,
    );
    let held_for = held.held_for().expect("held");
    assert_eq!(held_for, held.observed_at.saturating_since(claimed_at));

    sleep(pause).await;
    let renew_sent = Instant::now();
    let lease = store.renew(&lease).await.unwrap();
    let renew_answered = Instant::now();
    let renewed = store.inspect(&run("timed")).await.unwrap();
    let renewed_at = renewed.renewed_at.expect("a renewal sets renewed_at");
    apart(
        "claim to renewal",
        claimed_at,
        renewed_at,
        renew_sent - claim_answered,
        renew_answered - claim_sent,
    );
    assert_eq!(
        renewed.claimed_at,
        Some(claimed_at),
        "a renewal keeps the claim's time"
    );

    sleep(pause).await;
    let end_sent = Instant::now();
    store.complete(&lease).await.unwrap();
    let end_answered = Instant::now();
    let done = store.inspect(&run("timed")).await.unwrap();
    let ended_at = done.ended_at.expect("a completion sets ended_at");
    apart(
        "renewal to end",
        renewed_at,
        ended_at,
        end_sent - renew_answered,
        end_answered - renew_sent,
    );
    assert_eq!(
        times(&done)[..3],
        [Some(created_at), Some(claimed_at), Some(renewed_at)],
        "an end keeps the other times"
    );
    assert_eq!(done.held_for(), None, "an ended run is held by no one");
    let many = store.inspect_many(&[run("timed")]).await.unwrap();
    assert_eq!(
        times(many[0].as_ref().unwrap()),
        times(&done),
        "inspect_many"
    );
    let listed = store
        .list(&ListFilter::new().with_state(RunState::Completed))
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(times(&listed[0]), times(&done), "list");

    // Failed, resumed, claimed again: the end is cleared, the claim is the new one.
    store.create(&run("again")).await.unwrap();
    let first = store
        .claim(&run("again"), &w, t.at_least(60_000))
        .await
        .unwrap();
    store.renew(&first).await.unwrap();
    store.fail(&first, "no").await.unwrap();
    let failed = store.inspect(&run("again")).await.unwrap();
    assert!(
        failed.ended_at.is_some(),
        "a fail sets ended_at: {failed:?}"
    );
    let resumed = store.resume(&run("again")).await.unwrap();
    assert_eq!(
        resumed.ended_at, None,
        "a resume clears ended_at: {resumed:?}"
    );
    assert_eq!(
        resumed.claimed_at, failed.claimed_at,
        "the last claim's time stays"
    );
    sleep(pause).await;
    store
        .claim(&run("again"), &w, t.at_least(60_000))
        .await
        .unwrap();
    let second = store.inspect(&run("again")).await.unwrap();
    assert!(
        second.claimed_at > failed.claimed_at,
        "a new claim's time: {second:?} after {failed:?}"
    );
    assert_eq!(
        second.renewed_at, None,
        "a claim clears renewed_at: {second:?}"
    );

    // A waiting run cancelled: ended at the cancel, never claimed.
    store.create(&run("dropped")).await.unwrap();
    let cancel_sent = Instant::now();
    let cancelled = store.cancel(&run("dropped"), "not needed").await.unwrap();
    let dropped = store.inspect(&run("dropped")).await.unwrap();
    let ended = dropped.ended_at.expect("a cancel sets ended_at");
    assert_eq!(
        cancelled.ended_at,
        Some(ended),
        "cancel returns the end it set"
    );
    assert_eq!(dropped.claimed_at, None);
    apart(
        "cancel to the inspect's reading",
        ended,
        dropped.observed_at,
        Duration::ZERO,
        Instant::now() - cancel_sent,
    );
}
