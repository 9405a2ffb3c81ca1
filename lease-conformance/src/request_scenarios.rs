//! Requests at the edges: bad input refused with nothing changed, unknown runs, ids stored
//! verbatim, lists, forced releases, keyed appends and batched reads.

use std::collections::HashSet;

use lease_core::{
    Ended, Error, Fence, InvalidInput, Lease, ListFilter, RunId, RunState, Ttl, WorkerId, MAX_BATCH,
};

use crate::StoreFactory;

use crate::scenarios::{assert_ended, assert_stale, created, long, run, worker};

/// Bad input (empty, oversize, control-character ids, zero TTL, bad batch sizes, huge payloads)
/// is refused with a typed reason and changes nothing.
pub async fn bad_input_is_refused_and_changes_nothing(factory: &dyn StoreFactory) {
    assert!(matches!(RunId::new(""), Err(InvalidInput::EmptyId { .. })));
    assert!(matches!(
        RunId::new("x".repeat(256)),
        Err(InvalidInput::IdTooLong { len: 256, .. })
    ));
    assert!(matches!(
        WorkerId::new("tab\there"),
        Err(InvalidInput::ControlCharacter { at: 3, .. })
    ));
    assert!(matches!(
        Ttl::from_millis(0),
        Err(InvalidInput::TtlTooShort { .. })
    ));
    assert!(matches!(
        Ttl::from_secs(86_401),
        Err(InvalidInput::TtlTooLong { .. })
    ));

    let store = factory.fresh().await;
    let r = created(&*store, "guarded").await;
    for max in [0, MAX_BATCH + 1] {
        assert!(matches!(
            store.claim_next(&worker("a"), long(), max).await,
            Err(Error::InvalidInput(_))
        ));
    }
    let lease = store.claim(&r, &worker("a"), long()).await.unwrap();
    let huge = vec![0u8; lease_core::MAX_PAYLOAD_BYTES + 1];
    assert!(matches!(
        store.append(&lease, &huge).await,
        Err(Error::InvalidInput(InvalidInput::PayloadTooLarge { .. }))
    ));
    let filter = ListFilter::new().with_limit(0);
    assert!(matches!(
        store.list(&filter).await,
        Err(Error::InvalidInput(InvalidInput::ListLimit { .. }))
    ));
    let record = store.inspect(&r).await.unwrap();
    assert_eq!((record.fence.get(), record.heartbeats), (1, 0));
    assert!(store.journal(&r).await.unwrap().is_empty());
}

/// Every operation on a run that does not exist says so.
pub async fn unknown_runs_are_not_found(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let ghost = run("ghost");
    let lease = Lease::new(
        ghost.clone(),
        worker("a"),
        Fence::new(1).unwrap(),
        long(),
        Default::default(),
    )
    .unwrap();
    let not_found = |e: &Error| matches!(e, Error::NotFound { run } if *run == ghost);
    assert!(not_found(
        &store.claim(&ghost, &worker("a"), long()).await.unwrap_err()
    ));
    assert!(not_found(&store.inspect(&ghost).await.unwrap_err()));
    assert!(not_found(&store.journal(&ghost).await.unwrap_err()));
    assert!(not_found(&store.resume(&ghost).await.unwrap_err()));
    assert!(not_found(&store.force_release(&ghost).await.unwrap_err()));
    assert!(not_found(&store.renew(&lease).await.unwrap_err()));
    assert!(not_found(&store.append(&lease, b"x").await.unwrap_err()));
    assert!(not_found(&store.release(&lease).await.unwrap_err()));
    assert!(not_found(&store.suspend(&lease).await.unwrap_err()));
    assert!(not_found(&store.complete(&lease).await.unwrap_err()));
    let batch = store
        .renew_many(std::slice::from_ref(&lease))
        .await
        .unwrap();
    assert!(not_found(batch[0].as_ref().unwrap_err()));
    assert!(store
        .claim_next(&worker("a"), long(), 5)
        .await
        .unwrap()
        .is_empty());
}

/// Creating a run twice is refused and leaves the first record as it was.
pub async fn create_twice_is_refused(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let r = created(&*store, "twice").await;
    store.claim(&r, &worker("a"), long()).await.unwrap();
    assert!(matches!(
        store.create(&r).await,
        Err(Error::AlreadyExists { run }) if run == r
    ));
    let record = store.inspect(&r).await.unwrap();
    assert_eq!((record.fence.get(), record.owner), (1, Some(worker("a"))));
}

/// Run ids made of quotes, braces, colons, spaces, SQL, Lua and multi-byte text are stored and
/// returned verbatim, and distinct ids never collide.
pub async fn hostile_run_ids_are_stored_verbatim(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let ids = [
        "a'b\"c; DROP TABLE runs; --".to_string(),
        "{slot}:run:1".to_string(),
        "{slot}".to_string(),
        "run:1".to_string(),
        "run".to_string(),
        "with space".to_string(),
        "%s %d \\ $1 ]] --[[ ".to_string(),
        "é".repeat(127) + "x",
        "日本語のラン".to_string(),
    ];
    for id in &ids {
        let r = created(&*store, id).await;
        let lease = store.claim(&r, &worker("w:{x}"), long()).await.unwrap();
        store.append(&lease, id.as_bytes()).await.unwrap();
    }
    for id in &ids {
        let r = run(id);
        let record = store.inspect(&r).await.unwrap();
        assert_eq!(record.run.as_str(), id);
        assert_eq!(
            (record.fence.get(), record.owner),
            (1, Some(worker("w:{x}")))
        );
        let journal = store.journal(&r).await.unwrap();
        assert_eq!(journal.len(), 1, "{id}");
        assert_eq!(journal[0].payload, id.as_bytes());
    }
    let listed = store
        .list(&ListFilter::default())
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.run.as_str().to_string())
        .collect::<HashSet<_>>();
    assert_eq!(listed, ids.iter().cloned().collect::<HashSet<_>>());
}

/// `list` filters by state and by expiry, pages by run id, and orders by run id.
pub async fn list_filters_by_state_and_expiry(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let t = crate::timing(&*store);
    let a = created(&*store, "a").await;
    let b = created(&*store, "b").await;
    let c = created(&*store, "c").await;
    let d = created(&*store, "d").await;
    store.claim(&a, &worker("w"), long()).await.unwrap();
    store.claim(&b, &worker("w"), t.short_ttl()).await.unwrap();
    let lc = store.claim(&c, &worker("w"), long()).await.unwrap();
    store.suspend(&lc).await.unwrap();
    crate::until_expired(&*store, &b, t).await;

    let ids = |records: Vec<lease_core::RunRecord>| {
        records.into_iter().map(|r| r.run).collect::<Vec<_>>()
    };
    let all = store.list(&ListFilter::default()).await.unwrap();
    assert_eq!(ids(all), vec![a.clone(), b.clone(), c.clone(), d.clone()]);
    let runnable = ListFilter::new().with_state(Some(RunState::Runnable));
    assert_eq!(
        ids(store.list(&runnable).await.unwrap()),
        vec![a.clone(), b.clone(), d.clone()]
    );
    let expired = ListFilter::new().with_expired(true);
    assert_eq!(ids(store.list(&expired).await.unwrap()), vec![b.clone()]);
    let suspended = ListFilter::new().with_state(Some(RunState::Suspended));
    assert_eq!(ids(store.list(&suspended).await.unwrap()), vec![c.clone()]);
    let page = ListFilter::new().with_after(Some(a.clone())).with_limit(2);
    assert_eq!(ids(store.list(&page).await.unwrap()), vec![b, c]);
}

/// `force_release` takes a held run from its holder: the holder's writes are refused, and the
/// next claim gets a higher fence that fences the old holder out for good.
pub async fn force_release_hands_the_run_over_under_a_higher_fence(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let r = created(&*store, "taken-over").await;
    let a = store.claim(&r, &worker("a"), long()).await.unwrap();
    let record = store.force_release(&r).await.unwrap();
    assert_eq!((record.owner, record.fence.get()), (None, 1));
    assert_ended(store.append(&a, b"x").await, 1, Ended::Released);
    let b = store.claim(&r, &worker("b"), long()).await.unwrap();
    assert_eq!(b.fence().get(), 2);
    assert_stale(store.renew(&a).await, 1, 2);
    let s = store
        .claim(&created(&*store, "parked").await, &worker("a"), long())
        .await
        .unwrap();
    store.suspend(&s).await.unwrap();
    assert!(matches!(
        store.force_release(s.run()).await,
        Err(Error::Suspended { .. })
    ));
}

/// A keyed append applies once per key: the same key again answers the first entry (its own
/// payload, seq and fence) and writes nothing; another key appends; a keyed append under a
/// fence that moved on is refused as stale even though its key exists; under the current
/// fence an existing key answers its entry, even after the lease ended; a new key after the
/// end is refused as ended.
pub async fn a_keyed_append_applies_once_per_key(factory: &dyn StoreFactory) {
    use lease_core::IdempotencyKey;
    let key = |k: &str| IdempotencyKey::new(k).expect("valid key");
    let store = factory.fresh().await;
    let r = created(&*store, "keyed").await;
    let a = store.claim(&r, &worker("a"), long()).await.unwrap();
    let first = store
        .append_keyed(&a, &key("charge"), b"charged 10")
        .await
        .unwrap();
    assert_eq!((first.seq, first.fence.get()), (1, 1));
    let again = store
        .append_keyed(&a, &key("charge"), b"a retry's payload")
        .await
        .unwrap();
    assert_eq!(again, first, "the same key answers the first entry");
    let other = store
        .append_keyed(&a, &key("receipt"), b"mailed")
        .await
        .unwrap();
    assert_eq!((other.seq, other.payload.as_slice()), (2, &b"mailed"[..]));
    assert_eq!(store.journal(&r).await.unwrap().len(), 2);

    // Reclaimed: the old lease's keyed retry is stale, key or not.
    store.force_release(&r).await.unwrap();
    let b = store.claim(&r, &worker("b"), long()).await.unwrap();
    assert_stale(store.append_keyed(&a, &key("charge"), b"late").await, 1, 2);
    assert_stale(store.append_keyed(&a, &key("new"), b"late").await, 1, 2);
    // Under the current fence an existing key answers its entry, whoever wrote it.
    let seen = store
        .append_keyed(&b, &key("charge"), b"again")
        .await
        .unwrap();
    assert_eq!(seen, first);
    let third = store.append_keyed(&b, &key("b-step"), b"b").await.unwrap();
    assert_eq!((third.seq, third.fence.get()), (3, 2));
    store.complete(&b).await.unwrap();
    // A retry after the end learns its first result; a new key is refused as ended.
    assert_eq!(
        store.append_keyed(&b, &key("b-step"), b"b").await.unwrap(),
        third
    );
    assert_ended(
        store.append_keyed(&b, &key("after"), b"x").await,
        2,
        Ended::Completed,
    );
    assert_eq!(store.journal(&r).await.unwrap().len(), 3);
    // Bad input is refused before the store.
    assert!(matches!(
        IdempotencyKey::new(""),
        Err(InvalidInput::EmptyId { .. })
    ));
    let big = vec![0u8; lease_core::MAX_PAYLOAD_BYTES + 1];
    assert!(matches!(
        store.append_keyed(&b, &key("big"), &big).await,
        Err(Error::InvalidInput(InvalidInput::PayloadTooLarge { .. }))
    ));
}

/// `inspect_many` reads many records in one call, in input order, with `NotFound` for a run
/// that does not exist (repeats answered each time); each record is what `inspect` says; more
/// than `MAX_BATCH` ids are refused before the store.
pub async fn inspect_many_answers_each_run_in_order(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let a = created(&*store, "a").await;
    let b = created(&*store, "b").await;
    let held = store.claim(&b, &worker("w"), long()).await.unwrap();
    let missing = run("missing");
    let got = store
        .inspect_many(&[b.clone(), missing.clone(), a.clone(), b.clone()])
        .await
        .unwrap();
    assert_eq!(got.len(), 4);
    let one = got[0].as_ref().unwrap();
    assert_eq!(
        (one.run.clone(), one.fence, one.owner.clone(), one.state),
        (
            b.clone(),
            held.fence(),
            Some(worker("w")),
            RunState::Runnable
        )
    );
    assert!(matches!(&got[1], Err(Error::NotFound { run }) if *run == missing));
    assert_eq!(got[2].as_ref().unwrap().fence, Fence::ZERO);
    assert_eq!(got[3].as_ref().unwrap().run, b);
    assert!(store.inspect_many(&[]).await.unwrap().is_empty());
    let too_many: Vec<RunId> = (0..=MAX_BATCH).map(|i| run(&format!("r{i}"))).collect();
    assert!(matches!(
        store.inspect_many(&too_many).await,
        Err(Error::InvalidInput(InvalidInput::BatchTooLarge { .. }))
    ));
}
