//! Unique keys ([`NewRun::with_unique_key`]): while a run with a key is live (runnable or
//! suspended) no other run with that key is created, and the create names the live one; a run
//! that ends (completed, failed, cancelled) or is purged gives its key up; racing creates make
//! one run.
//!
//! A backend that keeps no keys refuses a create with one with [`InvalidInput::Unsupported`]
//! and creates nothing: the scenario checks that refusal and stops there.

use std::sync::Arc;
use std::time::Duration;

use lease_core::{Error, InvalidInput, LeaseStore, LeaseStoreExt, NewRun};

use crate::scenarios::{long, run, worker};
use crate::StoreFactory;

fn keyed(id: &str, key: &str) -> NewRun {
    NewRun::new(run(id)).with_unique_key(key)
}

/// Asserts `result` refused the create because `holder` exists.
#[track_caller]
fn assert_held_by<T: std::fmt::Debug>(result: lease_core::Result<T>, holder: &str) {
    match result {
        Err(Error::AlreadyExists { run }) => assert_eq!(run.as_str(), holder, "the named run"),
        other => panic!("expected AlreadyExists naming {holder}, got {other:?}"),
    }
}

async fn absent(store: &dyn LeaseStore, id: &str) {
    assert!(
        matches!(store.inspect(&run(id)).await, Err(Error::NotFound { .. })),
        "{id} was created"
    );
}

/// One live run per key, named to the creates it turns away, alone and in batches (where an
/// earlier item of the same batch holds the key too); the key is free again once its run has
/// completed, failed, been cancelled or been purged; a failed run resumed while another run
/// holds its key gives the key up; eight racing creates with one key make one run. Bad keys
/// are refused before any I/O.
pub async fn a_unique_key_keeps_one_live_run(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    for bad in ["", "tab\there", &"k".repeat(256)] {
        let err = store.create_with(&keyed("bad", bad)).await.unwrap_err();
        assert!(
            matches!(
                &err,
                Error::InvalidInput(
                    InvalidInput::EmptyId { what: "unique key" }
                        | InvalidInput::ControlCharacter {
                            what: "unique key",
                            ..
                        }
                        | InvalidInput::IdTooLong {
                            what: "unique key",
                            ..
                        }
                )
            ),
            "{bad:?}: {err:?}"
        );
    }
    absent(store.as_ref(), "bad").await;

    match store.create_with(&keyed("a", "k")).await {
        Ok(record) => assert_eq!(record.run.as_str(), "a"),
        Err(Error::InvalidInput(InvalidInput::Unsupported { .. })) => {
            absent(store.as_ref(), "a").await;
            assert!(matches!(
                store
                    .create_many_with(&[NewRun::new(run("plain")), keyed("b", "k")])
                    .await,
                Err(Error::InvalidInput(InvalidInput::Unsupported { .. }))
            ));
            absent(store.as_ref(), "plain").await;
            return;
        }
        Err(e) => panic!("create with a unique key: {e:?}"),
    }
    // The key, then the id: both turn a create away, each naming the run that exists.
    assert_held_by(store.create_with(&keyed("b", "k")).await, "a");
    absent(store.as_ref(), "b").await;
    assert_held_by(store.create_with(&keyed("a", "other")).await, "a");
    assert_held_by(store.create_with(&NewRun::new(run("a"))).await, "a");

    let mut batch = store
        .create_many_with(&[
            keyed("c", "k"),
            keyed("d", "k2"),
            keyed("e", "k2"),
            NewRun::new(run("f")),
            keyed("a", "k3"),
        ])
        .await
        .unwrap();
    assert!(batch[1].is_ok() && batch[3].is_ok(), "{batch:?}");
    assert_held_by(batch.remove(4), "a");
    assert_held_by(batch.remove(2), "d");
    assert_held_by(batch.remove(0), "a");
    for id in ["c", "e"] {
        absent(store.as_ref(), id).await;
    }

    // Held and suspended runs keep their key; a completed one gives it up.
    let lease = store.claim(&run("a"), &worker("w"), long()).await.unwrap();
    assert_held_by(store.create_with(&keyed("g", "k")).await, "a");
    store.suspend(&lease).await.unwrap();
    assert_held_by(store.create_with(&keyed("g", "k")).await, "a");
    store.resume(&run("a")).await.unwrap();
    let lease = store.claim(&run("a"), &worker("w"), long()).await.unwrap();
    store.complete(&lease).await.unwrap();
    store.create_with(&keyed("g", "k")).await.unwrap();
    assert_held_by(store.create_with(&keyed("h", "k")).await, "g");

    // A cancelled run gives its key up.
    store.cancel(&run("g"), "not needed").await.unwrap();
    store.create_with(&keyed("h", "k")).await.unwrap();

    // A failed run gives its key up; resumed while another run holds the key, it does not
    // take it back, and that run keeps it.
    let lease = store.claim(&run("d"), &worker("w"), long()).await.unwrap();
    store.fail(&lease, "broken").await.unwrap();
    store.create_with(&keyed("i", "k2")).await.unwrap();
    store.resume(&run("d")).await.unwrap();
    assert_held_by(store.create_with(&keyed("j", "k2")).await, "i");
    let lease = store.claim(&run("i"), &worker("w"), long()).await.unwrap();
    store.complete(&lease).await.unwrap();
    // "i" ended and "d" (live) gave the key up: the key is free.
    store.create_with(&keyed("j", "k2")).await.unwrap();

    // A failed run resumed while its key is free takes it back.
    let lease = store.claim(&run("j"), &worker("w"), long()).await.unwrap();
    store.fail(&lease, "broken").await.unwrap();
    store.resume(&run("j")).await.unwrap();
    assert_held_by(store.create_with(&keyed("k", "k2")).await, "j");

    // A purge of an ended run that once held a key leaves the key to the run holding it now.
    let lease = store.claim(&run("h"), &worker("w"), long()).await.unwrap();
    store.complete(&lease).await.unwrap();
    store.create_with(&keyed("l", "k")).await.unwrap();
    let purged = store
        .purge_ids(&[run("h"), run("a"), run("g")])
        .await
        .unwrap();
    assert_eq!(purged.len(), 3, "{purged:?}");
    assert_held_by(store.create_with(&keyed("m", "k")).await, "l");
    // ... and a purged holder's id is free, with its key.
    let lease = store.claim(&run("l"), &worker("w"), long()).await.unwrap();
    store.complete(&lease).await.unwrap();
    store.purge_ids(&[run("l")]).await.unwrap();
    store.create_with(&keyed("a", "k")).await.unwrap();

    // Eight creates of different ids with one key, at once: one run.
    let racers: Vec<_> = (0..8)
        .map(|i| {
            let store: Arc<dyn LeaseStore> = store.clone();
            tokio::spawn(
                async move { store.create_with(&keyed(&format!("race-{i}"), "hot")).await },
            )
        })
        .collect();
    let mut winners = Vec::new();
    let mut named = Vec::new();
    for racer in racers {
        match racer.await.unwrap() {
            Ok(record) => winners.push(record.run),
            Err(Error::AlreadyExists { run }) => named.push(run),
            Err(e) => panic!("a racing create: {e:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "{winners:?}");
    assert_eq!(named.len(), 7);
    assert!(named.iter().all(|r| r == &winners[0]), "{named:?}");

    // The key is the same however long the holder waits: a run scheduled for later holds it.
    store
        .create_with(&keyed("later", "scheduled").with_delay(Duration::from_secs(3600)))
        .await
        .unwrap();
    assert_held_by(store.create_with(&keyed("now", "scheduled")).await, "later");
}
