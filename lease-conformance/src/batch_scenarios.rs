//! Batch scenarios: `end_many` (group-committed ends of leases, with the one-write
//! effect-and-complete) and `create_many`.

use lease_core::{
    End, Ended, Ending, Error, Fence, InvalidInput, Lease, LeaseStore, LeaseStoreExt, ListFilter,
    RunId, RunState, StoreTime, MAX_BATCH, MAX_PAYLOAD_BYTES,
};

use crate::scenarios::{created, long, run, worker};
use crate::StoreFactory;

/// A lease the store never issued, for a run that may not exist.
fn forged(id: &RunId, fence: u64) -> Lease {
    Lease::new(
        id.clone(),
        worker("forger"),
        Fence::new(fence).expect("fence in range"),
        long(),
        StoreTime::default(),
    )
    .expect("fence above zero")
}

#[track_caller]
fn expect_ended(result: &lease_core::Result<()>, fence: u64, how: Ended, item: &str) {
    match result {
        Err(Error::LeaseEnded {
            fence: f, ended, ..
        }) if (*f, *ended) == (fence, how) => {}
        other => {
            panic!("{item}: expected LeaseEnded {{ fence: {fence}, ended: {how} }}, got {other:?}")
        }
    }
}

/// `end_many` ends each lease as its item says (complete, complete with an effect, release,
/// suspend) in one call, and gives every item its own verdict: a stale, ended, unknown or
/// never-issued lease is refused alone, with its reason, and the others commit.
pub async fn end_many_ends_each_lease_as_asked_with_a_verdict_per_item(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let t = crate::timing(&*store);
    let a = worker("a");
    let mut leases = Vec::new();
    for id in ["complete", "effect", "release", "suspend", "done", "ahead"] {
        let r = created(&*store, id).await;
        leases.push(store.claim(&r, &a, long()).await.unwrap());
    }
    let stale_run = created(&*store, "stale").await;
    let stale = store.claim(&stale_run, &a, t.short_ttl()).await.unwrap();
    crate::until_expired(&*store, &stale_run, t).await;
    store.claim(&stale_run, &worker("b"), long()).await.unwrap();
    store.complete(&leases[4]).await.unwrap();

    let batch = vec![
        Ending::new(leases[0].clone(), End::Complete),
        Ending::new(leases[1].clone(), End::CompleteWith(b"charged".to_vec())),
        Ending::new(leases[2].clone(), End::Release),
        Ending::new(leases[3].clone(), End::Suspend),
        Ending::new(stale.clone(), End::CompleteWith(b"late".to_vec())),
        Ending::new(leases[4].clone(), End::Release),
        Ending::new(forged(&run("missing"), 1), End::Complete),
        Ending::new(forged(leases[5].run(), 2), End::Complete),
    ];
    let results = store.end_many(&batch).await.unwrap();
    assert_eq!(results.len(), batch.len(), "one result per item");
    for (i, name) in ["complete", "complete-with", "release", "suspend"]
        .iter()
        .enumerate()
    {
        assert!(results[i].is_ok(), "{name}: {:?}", results[i]);
    }
    match &results[4] {
        Err(Error::StaleFence {
            presented: 1,
            current: 2,
            ..
        }) => {}
        other => panic!("stale item: expected StaleFence 1 < 2, got {other:?}"),
    }
    expect_ended(&results[5], 1, Ended::Completed, "already completed item");
    assert!(
        matches!(&results[6], Err(Error::NotFound { run }) if run.as_str() == "missing"),
        "unknown run: {:?}",
        results[6]
    );
    assert!(
        matches!(
            &results[7],
            Err(Error::FenceAhead {
                presented: 2,
                current: 1,
                ..
            })
        ),
        "never-issued fence: {:?}",
        results[7]
    );

    let state = |id: &'static str| {
        let store = store.clone();
        async move { store.inspect(&run(id)).await.unwrap() }
    };
    for (id, want) in [
        ("complete", RunState::Completed),
        ("effect", RunState::Completed),
        ("release", RunState::Runnable),
        ("suspend", RunState::Suspended),
        ("stale", RunState::Runnable),
        ("ahead", RunState::Runnable),
    ] {
        let record = state(id).await;
        assert_eq!(record.state, want, "{id}");
        if id == "stale" || id == "ahead" {
            assert!(
                record.owner.is_some(),
                "{id}: a refused item keeps its holder"
            );
        } else {
            assert!(record.owner.is_none(), "{id}: an ended lease has no owner");
            assert!(record.expires_at.is_none(), "{id}: and no expiry");
        }
    }
    let journal = store.journal(&run("effect")).await.unwrap();
    assert_eq!(journal.len(), 1);
    assert_eq!(
        (journal[0].payload.as_slice(), journal[0].fence.get()),
        (&b"charged"[..], 1)
    );
    assert!(
        store.journal(&stale_run).await.unwrap().is_empty(),
        "a refused complete-with writes no effect"
    );
    // The released run is claimable at once, under the next fence; the suspended one is not.
    let next = store.claim_next(&worker("c"), long(), 10).await.unwrap();
    let claimed: Vec<(&str, u64)> = next
        .iter()
        .map(|l| (l.run().as_str(), l.fence().get()))
        .collect();
    assert_eq!(claimed, vec![("release", 2)]);
}

/// An effect and its completion are one write: a complete-with under a stale fence leaves no
/// journal entry and no completion, and one under the current fence leaves exactly one entry
/// under that fence and a completed run, after which the lease writes nothing more.
pub async fn complete_with_writes_its_effect_only_with_the_completion(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let t = crate::timing(&*store);
    let r = created(&*store, "order-7").await;
    let old = store.claim(&r, &worker("a"), t.short_ttl()).await.unwrap();
    store.append(&old, b"step 1").await.unwrap();
    crate::until_expired(&*store, &r, t).await;
    let new = store.claim(&r, &worker("b"), long()).await.unwrap();

    match store.complete_with(&old, b"charge card").await {
        Err(Error::StaleFence {
            presented: 1,
            current: 2,
            ..
        }) => {}
        other => panic!("expected StaleFence 1 < 2, got {other:?}"),
    }
    let record = store.inspect(&r).await.unwrap();
    assert_eq!(
        record.state,
        RunState::Runnable,
        "the stale completion did not land"
    );
    assert_eq!(store.journal(&r).await.unwrap().len(), 1, "nor its effect");

    store.complete_with(&new, b"charge card").await.unwrap();
    let journal = store.journal(&r).await.unwrap();
    let entries: Vec<(&[u8], u64, u64)> = journal
        .iter()
        .map(|e| (e.payload.as_slice(), e.fence.get(), e.seq))
        .collect();
    assert_eq!(
        entries,
        vec![(&b"step 1"[..], 1, 1), (&b"charge card"[..], 2, 2)]
    );
    assert_eq!(store.inspect(&r).await.unwrap().state, RunState::Completed);
    expect_ended(
        &store.append(&new, b"again").await.map(|_| ()),
        2,
        Ended::Completed,
        "append after complete-with",
    );
}

/// A retried `end_many` recognises its own commit: each item that was applied answers
/// `LeaseEnded` with the same fence and the `Ended` of its end, and nothing changes twice.
pub async fn a_retried_end_many_answers_lease_ended_with_its_own_fence(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let a = worker("a");
    let ends = [
        End::Complete,
        End::CompleteWith(b"x".to_vec()),
        End::Release,
        End::Suspend,
    ];
    let mut batch = Vec::new();
    for (i, end) in ends.iter().enumerate() {
        let r = created(&*store, &format!("retry-{i}")).await;
        let lease = store.claim(&r, &a, long()).await.unwrap();
        batch.push(Ending::new(lease, end.clone()));
    }
    let first = store.end_many(&batch).await.unwrap();
    assert!(first.iter().all(Result::is_ok), "{first:?}");
    let again = store.end_many(&batch).await.unwrap();
    for (item, result) in batch.iter().zip(&again) {
        expect_ended(
            result,
            item.lease.fence().get(),
            item.end.ended(),
            item.end.as_str(),
        );
    }
    let journal = store.journal(batch[1].lease.run()).await.unwrap();
    assert_eq!(journal.len(), 1, "the retried effect was not written twice");
}

/// A batch that breaks the input rules (the same run twice, a payload over the limit, more than
/// `MAX_BATCH` items) is refused as a whole with its reason before any write; an empty batch
/// is answered with no results.
pub async fn end_many_refuses_a_bad_batch_and_changes_nothing(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let r = created(&*store, "guarded").await;
    let other = created(&*store, "other").await;
    let lease = store.claim(&r, &worker("a"), long()).await.unwrap();
    let other_lease = store.claim(&other, &worker("a"), long()).await.unwrap();
    assert!(store.end_many(&[]).await.unwrap().is_empty());

    let twice = [
        Ending::new(other_lease.clone(), End::Complete),
        Ending::new(lease.clone(), End::Complete),
        Ending::new(lease.clone(), End::Release),
    ];
    match store.end_many(&twice).await {
        Err(Error::InvalidInput(InvalidInput::DuplicateRun { run })) => assert_eq!(run, r),
        other => panic!("expected DuplicateRun, got {other:?}"),
    }
    let huge = [
        Ending::new(other_lease.clone(), End::Complete),
        Ending::new(
            lease.clone(),
            End::CompleteWith(vec![7; MAX_PAYLOAD_BYTES + 1]),
        ),
    ];
    assert!(matches!(
        store.end_many(&huge).await,
        Err(Error::InvalidInput(InvalidInput::PayloadTooLarge { .. }))
    ));
    let too_many: Vec<Ending> = (0..=MAX_BATCH)
        .map(|i| Ending::new(forged(&run(&format!("n{i}")), 1), End::Complete))
        .collect();
    assert!(matches!(
        store.end_many(&too_many).await,
        Err(Error::InvalidInput(InvalidInput::BatchTooLarge { .. }))
    ));
    for (id, lease) in [(&r, &lease), (&other, &other_lease)] {
        let record = store.inspect(id).await.unwrap();
        assert_eq!(record.state, RunState::Runnable, "{id}: untouched");
        assert_eq!(
            record.owner.as_ref(),
            Some(lease.owner()),
            "{id}: still held"
        );
        assert!(store.journal(id).await.unwrap().is_empty());
    }
}

/// A full batch of `MAX_BATCH` complete-with items commits in one call, each run completed with
/// its own effect under its own fence; `release_many` and `complete_many` end full batches too.
pub async fn full_batches_of_ends_commit_every_item(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let ids: Vec<RunId> = (0..3 * MAX_BATCH)
        .map(|i| run(&format!("job-{i:05}")))
        .collect();
    for chunk in ids.chunks(MAX_BATCH) {
        let created = store.create_many(chunk).await.unwrap();
        assert!(created.iter().all(Result::is_ok));
    }
    let a = worker("a");
    let mut leases = Vec::new();
    while leases.len() < ids.len() {
        let got = store.claim_next(&a, long(), MAX_BATCH).await.unwrap();
        assert!(!got.is_empty(), "claim_next ran dry at {}", leases.len());
        leases.extend(got);
    }
    leases.sort_by(|x, y| x.run().cmp(y.run()));
    let (effects, rest) = leases.split_at(MAX_BATCH);
    let (completes, releases) = rest.split_at(MAX_BATCH);
    let batch: Vec<Ending> = effects
        .iter()
        .map(|l| {
            let payload = format!("effect of {}", l.run()).into_bytes();
            Ending::new(l.clone(), End::CompleteWith(payload))
        })
        .collect();
    let results = store.end_many(&batch).await.unwrap();
    assert_eq!(results.len(), MAX_BATCH);
    assert!(
        results.iter().all(Result::is_ok),
        "{:?}",
        results.iter().find(|r| r.is_err())
    );
    let results = store.complete_many(completes).await.unwrap();
    assert!(results.iter().all(Result::is_ok));
    let results = store.release_many(releases).await.unwrap();
    assert!(results.iter().all(Result::is_ok));

    for lease in effects.iter().step_by(97) {
        let journal = store.journal(lease.run()).await.unwrap();
        assert_eq!(journal.len(), 1, "{}", lease.run());
        assert_eq!(
            journal[0].payload,
            format!("effect of {}", lease.run()).into_bytes()
        );
        assert_eq!(journal[0].fence, lease.fence());
    }
    let count = |state| {
        let store = store.clone();
        async move { count_state(&*store, state).await }
    };
    assert_eq!(count(RunState::Completed).await, 2 * MAX_BATCH);
    assert_eq!(count(RunState::Runnable).await, MAX_BATCH);
    let again = store
        .claim_next(&worker("b"), long(), MAX_BATCH)
        .await
        .unwrap();
    assert_eq!(
        again.len(),
        MAX_BATCH,
        "every released run is claimable at once"
    );
    assert!(again.iter().all(|l| l.fence().get() == 2));
}

async fn count_state(store: &dyn LeaseStore, state: RunState) -> usize {
    let mut n = 0;
    let mut after = None;
    loop {
        let page = store
            .list(
                &ListFilter::new()
                    .with_state(Some(state))
                    .with_after(after.clone())
                    .with_limit(1_000),
            )
            .await
            .unwrap();
        let Some(last) = page.last() else { return n };
        after = Some(last.run.clone());
        n += page.len();
    }
}

/// `create_many` creates runs as `create` does, one result per id in order: an id that exists,
/// or repeats one earlier in the batch, is refused alone with `AlreadyExists`; runs created
/// together are claimed in the order given.
pub async fn create_many_refuses_existing_ids_alone_and_keeps_order(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let first = created(&*store, "a-first").await;
    let batch = [
        run("z-second"),
        first.clone(),
        run("m-third"),
        run("z-second"),
    ];
    let results = store.create_many(&batch).await.unwrap();
    assert_eq!(results.len(), 4);
    assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
    for i in [1, 3] {
        assert!(
            matches!(&results[i], Err(Error::AlreadyExists { run }) if *run == batch[i]),
            "item {i}: {:?}",
            results[i]
        );
    }
    for id in ["z-second", "m-third"] {
        let record = store.inspect(&run(id)).await.unwrap();
        assert_eq!(
            (record.state, record.fence.get(), record.heartbeats),
            (RunState::Runnable, 0, 0)
        );
        assert!(record.owner.is_none());
    }
    let claimed = store.claim_next(&worker("a"), long(), 10).await.unwrap();
    let order: Vec<&str> = claimed.iter().map(|l| l.run().as_str()).collect();
    assert_eq!(order, vec!["a-first", "z-second", "m-third"]);

    assert!(store.create_many(&[]).await.unwrap().is_empty());
    let too_many: Vec<RunId> = (0..=MAX_BATCH).map(|i| run(&format!("x{i}"))).collect();
    assert!(matches!(
        store.create_many(&too_many).await,
        Err(Error::InvalidInput(InvalidInput::BatchTooLarge { .. }))
    ));
    assert!(
        matches!(store.inspect(&run("x0")).await, Err(Error::NotFound { .. })),
        "a refused batch creates nothing"
    );
}

/// A batch whose effects together exceed `MAX_BATCH_PAYLOAD_BYTES` (each within its own
/// limit) is refused as a whole before any write, and the same leases end in smaller batches.
pub async fn end_many_refuses_a_batch_whose_effects_are_too_large_together(
    factory: &dyn StoreFactory,
) {
    let store = factory.fresh().await;
    let each = lease_core::MAX_PAYLOAD_BYTES;
    let n = lease_core::MAX_BATCH_PAYLOAD_BYTES / each + 1;
    let mut leases = Vec::new();
    for i in 0..n {
        let r = created(&*store, &format!("big-{i:03}")).await;
        leases.push(store.claim(&r, &worker("a"), long()).await.unwrap());
    }
    let batch: Vec<Ending> = leases
        .iter()
        .map(|l| Ending::new(l.clone(), End::CompleteWith(vec![b'x'; each])))
        .collect();
    match store.end_many(&batch).await {
        Err(Error::InvalidInput(InvalidInput::BatchPayloadTooLarge { len, max })) => {
            assert_eq!((len, max), (n * each, lease_core::MAX_BATCH_PAYLOAD_BYTES));
        }
        other => panic!("expected BatchPayloadTooLarge, got {other:?}"),
    }
    for lease in &leases {
        let record = store.inspect(lease.run()).await.unwrap();
        assert_eq!(record.state, RunState::Runnable, "nothing was written");
        assert!(store.journal(lease.run()).await.unwrap().is_empty());
    }
    let (first, second) = batch.split_at(n / 2);
    for half in [first, second] {
        let results = store.end_many(half).await.unwrap();
        assert!(results.iter().all(Result::is_ok), "{results:?}");
    }
    assert_eq!(count_state(&*store, RunState::Completed).await, n);
}
