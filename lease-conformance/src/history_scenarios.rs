//! The attempt history: each claim's worker, fence, number, times and how it ended, the last
//! [`MAX_HISTORY`] of them, kept with the run and removed with it.

use std::time::Duration;

use lease_core::{
    Attempt, AttemptOutcome, End, Error, LeaseStore, LeaseStoreExt, RunId, RunRecord,
    MAX_ATTEMPT_ERROR_BYTES, MAX_HISTORY,
};

use crate::scenarios::{created, long, worker};
use crate::StoreFactory;

async fn history(store: &dyn LeaseStore, run: &RunId) -> (RunRecord, Vec<Attempt>) {
    let record = store.inspect(run).await.expect("inspect");
    let history = record
        .history
        .clone()
        .unwrap_or_else(|| panic!("the store keeps a history, but inspect gave none: {record:?}"));
    (record, history)
}

/// `(outcome, fence, worker, attempt number, error)` of each attempt.
fn summary(h: &[Attempt]) -> Vec<(AttemptOutcome, u64, String, u64, Option<String>)> {
    h.iter()
        .map(|a| {
            let worker = a.worker.to_string();
            (a.outcome, a.fence.get(), worker, a.attempt, a.error.clone())
        })
        .collect()
}

/// Each attempt's times are on the store's clock, in the order the run's life gave them: a
/// claim before its end, an end before the next claim, none after the record was read.
#[track_caller]
fn in_order(record: &RunRecord, h: &[Attempt]) {
    let mut last = None;
    for a in h {
        let claimed = a
            .claimed_at
            .unwrap_or_else(|| panic!("a claim time: {a:?}"));
        assert!(
            last <= Some(claimed),
            "claimed before the previous end: {h:#?}"
        );
        match a.outcome {
            AttemptOutcome::Held => assert_eq!(a.ended_at, None, "{a:?}"),
            _ => {
                let ended = a.ended_at.unwrap_or_else(|| panic!("an end time: {a:?}"));
                assert!(claimed <= ended, "ended before its claim: {a:?}");
                last = Some(ended);
            }
        }
        assert!(last.is_none_or(|at| at <= record.observed_at), "{h:#?}");
    }
}

/// A run's history names every attempt's end: an expired lease (written by the claim that
/// takes over, ended at the lease's expiry), an attempt failed and retried with its error, a
/// release, a force-release, a suspend, a fail with its reason, a cancel of a held run with
/// the cancellation's reason, and the claim still held. Attempt numbers follow the budget's
/// counter (a voluntary end refunds, a resume starts again), fences every claim. A retried
/// end writes nothing more; a refused stale end writes nothing at all.
pub async fn the_attempt_history_tells_how_each_attempt_ended(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let t = crate::timing(&*store);
    let r = created(&*store, "hist").await;
    if !store.capabilities().attempt_history {
        let a = store.claim(&r, &worker("a"), long()).await.unwrap();
        store.complete(&a).await.unwrap();
        let record = store.inspect(&r).await.unwrap();
        assert_eq!(record.history, None, "a store that keeps no history");
        return;
    }
    assert_eq!(
        history(&*store, &r).await.1,
        vec![],
        "a new run has no attempt"
    );

    let a = store.claim(&r, &worker("a"), t.short_ttl()).await.unwrap();
    let (_, h) = history(&*store, &r).await;
    assert_eq!(
        summary(&h),
        vec![(AttemptOutcome::Held, 1, "a".into(), 1, None)]
    );
    crate::until_expired(&*store, &r, t).await;
    let (_, h) = history(&*store, &r).await;
    assert_eq!(
        (h[0].outcome, h[0].ended_at),
        (AttemptOutcome::Expired, Some(a.expires_at())),
        "an expired lease not claimed again ends at its expiry"
    );

    let b = store.claim(&r, &worker("b"), long()).await.unwrap();
    // The expired holder's end comes too late: refused, and it writes nothing.
    assert!(matches!(
        store.complete(&a).await,
        Err(Error::StaleFence { .. })
    ));
    let failed = End::AttemptFailed {
        retry_after: Duration::ZERO,
        reason: "card declined: <b>insufficient funds</b>".into(),
    };
    store.end_one(&b, failed.clone()).await.unwrap();
    // Sent again (a lost answer): recognised, not written twice.
    let again = store.end_one(&b, failed).await;
    assert!(matches!(again, Err(Error::LeaseEnded { .. })), "{again:?}");

    let c = store.claim(&r, &worker("c"), long()).await.unwrap();
    store.release(&c).await.unwrap();
    let d = store.claim(&r, &worker("d"), long()).await.unwrap();
    store.force_release(&r).await.unwrap();
    assert!(
        store.release(&d).await.is_err(),
        "a force-released holder is fenced out"
    );
    let e = store.claim(&r, &worker("e"), long()).await.unwrap();
    store.suspend(&e).await.unwrap();
    store.resume(&r).await.unwrap();
    let f = store.claim(&r, &worker("f"), long()).await.unwrap();
    store.fail(&f, "gave up").await.unwrap();
    store.resume(&r).await.unwrap();
    store.claim(&r, &worker("g"), long()).await.unwrap();

    let (record, h) = history(&*store, &r).await;
    let no = None;
    assert_eq!(
        summary(&h),
        vec![
            (AttemptOutcome::Expired, 1, "a".into(), 1, no.clone()),
            (
                AttemptOutcome::Retried,
                2,
                "b".into(),
                2,
                Some("card declined: <b>insufficient funds</b>".into())
            ),
            (AttemptOutcome::Released, 3, "c".into(), 3, no.clone()),
            (AttemptOutcome::ForceReleased, 4, "d".into(), 3, no.clone()),
            (AttemptOutcome::Suspended, 5, "e".into(), 4, no.clone()),
            (
                AttemptOutcome::Failed,
                6,
                "f".into(),
                1,
                Some("gave up".into())
            ),
            (AttemptOutcome::Held, 7, "g".into(), 1, no.clone()),
        ],
        "{h:#?}"
    );
    assert_eq!(
        h[0].ended_at,
        Some(a.expires_at()),
        "the expiry ended a's attempt"
    );
    in_order(&record, &h);
    assert_eq!(
        record.claimed_at, h[6].claimed_at,
        "the held claim is the record's"
    );

    // A cancel ends the held attempt with its reason; the run's record keeps it too.
    store.cancel(&r, "customer asked").await.unwrap();
    let (record, h) = history(&*store, &r).await;
    let last = h.last().unwrap();
    assert_eq!(
        (last.outcome, last.fence.get(), last.error.as_deref()),
        (AttemptOutcome::Cancelled, 7, Some("customer asked"))
    );
    assert_eq!(h.len(), 7);
    in_order(&record, &h);

    // A lease that expired before the cancel ended by its expiry, not by the cancel.
    let s = created(&*store, "hist-late-cancel").await;
    let gone = store.claim(&s, &worker("a"), t.short_ttl()).await.unwrap();
    crate::until_expired(&*store, &s, t).await;
    store.cancel(&s, "too late").await.unwrap();
    let (_, h) = history(&*store, &s).await;
    assert_eq!(
        (summary(&h), h[0].ended_at),
        (
            vec![(AttemptOutcome::Expired, 1, "a".into(), 1, None)],
            Some(gone.expires_at())
        )
    );
}

/// The history keeps the last [`MAX_HISTORY`] attempts, an attempt's error at most
/// [`MAX_ATTEMPT_ERROR_BYTES`] (cut at a character boundary; the run's failure keeps it all),
/// and a purge removes it with the run: the id created again starts with none.
pub async fn the_attempt_history_is_bounded_and_goes_with_its_run(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    if !store.capabilities().attempt_history {
        return;
    }
    let r = created(&*store, "hist-many").await;
    let rounds = MAX_HISTORY as u64 + 2;
    for _ in 0..rounds {
        let l = store.claim(&r, &worker("w"), long()).await.unwrap();
        store.release(&l).await.unwrap();
    }
    let (record, h) = history(&*store, &r).await;
    let fences: Vec<u64> = h.iter().map(|a| a.fence.get()).collect();
    assert_eq!(
        fences,
        (3..=rounds).collect::<Vec<_>>(),
        "the last {MAX_HISTORY}"
    );
    assert!(h.iter().all(|a| a.outcome == AttemptOutcome::Released));
    in_order(&record, &h);

    let reason = format!("x{}", "é".repeat(MAX_ATTEMPT_ERROR_BYTES));
    let l = store.claim(&r, &worker("w"), long()).await.unwrap();
    store.fail(&l, &reason).await.unwrap();
    let (record, h) = history(&*store, &r).await;
    assert_eq!(h.len(), MAX_HISTORY);
    let kept = h.last().unwrap().error.clone().unwrap();
    assert!(
        kept.len() <= MAX_ATTEMPT_ERROR_BYTES
            && kept.len() + 2 > MAX_ATTEMPT_ERROR_BYTES
            && reason.starts_with(&kept),
        "kept {} bytes",
        kept.len()
    );
    assert_eq!(
        record.failure.as_deref(),
        Some(reason.as_str()),
        "the run keeps it all"
    );

    let gone = created(&*store, "hist-purged").await;
    let l = store.claim(&gone, &worker("w"), long()).await.unwrap();
    store.complete(&l).await.unwrap();
    let purged = store.purge(Duration::ZERO, 1_000).await.unwrap();
    assert!(purged.contains(&gone), "{purged:?}");
    store.create(&gone).await.unwrap();
    assert_eq!(
        history(&*store, &gone).await.1,
        vec![],
        "created again: no history"
    );
}
