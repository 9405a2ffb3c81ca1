//! Queues ([`NewRun::with_queue`]): a claim takes runs of one queue, and a paused queue is
//! claimed by no one until it is resumed ([`LeaseStore::pause_queue`]).
//!
//! A backend without queues says so ([`Capabilities::queues`](lease_core::Capabilities)) and
//! refuses a create in another queue, a claim from one and a pause with
//! [`InvalidInput::Unsupported`], creating nothing: the scenario checks those refusals and
//! stops there.

use lease_core::{Error, InvalidInput, Kind, Lease, ListFilter, NewRun, Queue};

use crate::scenarios::{long, run, worker};
use crate::StoreFactory;

fn queue(name: &str) -> Queue {
    Queue::new(name).expect("valid queue")
}

fn in_queue(id: &str, name: &str) -> NewRun {
    NewRun::new(run(id)).with_queue(queue(name))
}

fn ids(leases: &[Lease]) -> Vec<&str> {
    leases.iter().map(|l| l.run().as_str()).collect()
}

#[track_caller]
fn assert_unsupported<T: std::fmt::Debug>(result: lease_core::Result<T>) {
    assert!(
        matches!(
            result,
            Err(Error::InvalidInput(InvalidInput::Unsupported { .. }))
        ),
        "expected Unsupported, got {result:?}"
    );
}

/// Runs are claimed from their own queue only, and carry it on their records and leases; a
/// paused queue is claimed from by no one (its held leases run on, a claim by id still takes
/// its runs, other queues are not held back), and once resumed its runs are claimed again.
/// Pausing twice keeps the first pause's time. A backend without queues refuses all of it.
pub async fn queues_are_claimed_apart_and_a_paused_one_by_no_one(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let w = worker("w");
    let (mail, other, email) = (queue("mail"), queue("other"), Kind::new("email").unwrap());
    if !store.capabilities().queues {
        assert_unsupported(store.create_with(&in_queue("m1", "mail")).await);
        assert_unsupported(
            store
                .create_many_with(&[NewRun::new(run("plain")), in_queue("m2", "mail")])
                .await,
        );
        for id in ["m1", "m2", "plain"] {
            assert!(
                matches!(store.inspect(&run(id)).await, Err(Error::NotFound { .. })),
                "{id} was created"
            );
        }
        assert_unsupported(store.pause_queue(&mail).await);
        assert_unsupported(
            store
                .claim_next_in(&mail, &Kind::default(), &w, long(), 1)
                .await,
        );
        // The default queue is the only one, and claim_next_in serves it.
        store.create(&run("d1")).await.unwrap();
        let listed = store
            .list(&ListFilter::new().with_queue(mail.clone()))
            .await
            .unwrap();
        assert!(listed.is_empty(), "{listed:?}");
        let listed = store
            .list(&ListFilter::new().with_queue(Queue::default()))
            .await
            .unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        let leases = store
            .claim_next_in(&Queue::default(), &Kind::default(), &w, long(), 1)
            .await
            .unwrap();
        assert_eq!(ids(&leases), ["d1"]);
        assert!(leases[0].queue().is_default());
        return;
    }

    let record = store.create_with(&in_queue("m1", "mail")).await.unwrap();
    assert_eq!(record.queue, mail, "the create's record");
    let batch = store
        .create_many_with(&[
            NewRun::new(run("d1")),
            in_queue("m2", "mail"),
            in_queue("m3", "mail").with_kind(email.clone()),
            in_queue("o1", "other"),
        ])
        .await
        .unwrap();
    assert!(batch.iter().all(Result::is_ok), "{batch:?}");
    assert_eq!(store.inspect(&run("m3")).await.unwrap().queue, mail);
    assert!(store.inspect(&run("d1")).await.unwrap().queue.is_default());
    // A kind filter finds a kind's runs in every queue.
    let listed = store
        .list(&ListFilter::new().with_kind(email.clone()))
        .await
        .unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!((listed[0].run.as_str(), &listed[0].queue), ("m3", &mail));
    // A queue filter finds what waits in a queue, of every kind.
    let shared = &store;
    let in_mail = |filter: ListFilter| async move {
        let listed = shared.list(&filter).await.unwrap();
        listed
            .iter()
            .map(|r| r.run.as_str().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        in_mail(ListFilter::new().with_queue(mail.clone())).await,
        ["m1", "m2", "m3"]
    );
    assert_eq!(
        in_mail(ListFilter::new().with_queue(Queue::default())).await,
        ["d1"]
    );
    assert_eq!(
        in_mail(
            ListFilter::new()
                .with_queue(mail.clone())
                .with_kind(email.clone())
        )
        .await,
        ["m3"]
    );

    // claim_next serves the default queue alone.
    let leases = store.claim_next(&w, long(), 10).await.unwrap();
    assert_eq!(ids(&leases), ["d1"]);
    assert!(leases[0].queue().is_default());
    let held = store
        .claim_next_in(&mail, &Kind::default(), &w, long(), 1)
        .await
        .unwrap();
    assert_eq!(ids(&held), ["m1"], "the queue's oldest first");
    assert_eq!(held[0].queue(), &mail);

    let paused = store.pause_queue(&mail).await.unwrap();
    assert!(paused.paused && paused.queue == mail, "{paused:?}");
    let again = store.pause_queue(&mail).await.unwrap();
    assert!(again.paused);
    assert_eq!(
        again.changed_at, paused.changed_at,
        "a second pause changes nothing"
    );
    let listed = store.queues().await.unwrap();
    assert!(
        listed.iter().any(|q| q.queue == mail && q.paused),
        "{listed:?}"
    );
    // A queue never paused is listed while it has runnable runs, with no time.
    assert!(
        listed
            .iter()
            .any(|q| q.queue == other && !q.paused && q.changed_at.is_none()),
        "{listed:?}"
    );
    for kind in [Kind::default(), email.clone()] {
        let none = store
            .claim_next_in(&mail, &kind, &w, long(), 10)
            .await
            .unwrap();
        assert!(none.is_empty(), "a paused queue gave {:?}", ids(&none));
    }
    // Other queues are not held back; the paused queue's held lease runs to its end.
    let leases = store
        .claim_next_in(&other, &Kind::default(), &w, long(), 10)
        .await
        .unwrap();
    assert_eq!(ids(&leases), ["o1"]);
    let renewed = store.renew(&held[0]).await.unwrap();
    store.complete(&renewed).await.unwrap();
    // A claim by id is an operator's, and takes the run whatever its queue's state.
    let by_id = store.claim(&run("m2"), &w, long()).await.unwrap();
    assert_eq!(by_id.queue(), &mail, "a claim by id's lease");
    store.release(&by_id).await.unwrap();

    let resumed = store.resume_queue(&mail).await.unwrap();
    assert!(!resumed.paused && resumed.queue == mail, "{resumed:?}");
    let leases = store
        .claim_next_in(&mail, &Kind::default(), &w, long(), 10)
        .await
        .unwrap();
    assert_eq!(ids(&leases), ["m2"]);
    let leases = store
        .claim_next_in(&mail, &email, &w, long(), 10)
        .await
        .unwrap();
    assert_eq!(ids(&leases), ["m3"]);
    assert_eq!((leases[0].kind(), leases[0].queue()), (&email, &mail));
    // Its end finds its index: the run is completed, and nothing of it is claimable.
    store.complete(&leases[0]).await.unwrap();
    assert!(store
        .claim_next_in(&mail, &email, &w, long(), 10)
        .await
        .unwrap()
        .is_empty());
    assert!(store.queues().await.unwrap().iter().all(|q| !q.paused));

    // Every write that puts a run back in its queue's index, or takes it out, finds the
    // index: a force-release and a resume make it claimable from its queue again, a cancel
    // leaves nothing to claim.
    for id in ["m4", "m5", "m6"] {
        store
            .create_with(&in_queue(id, "mail").with_priority(4))
            .await
            .unwrap();
    }
    store.cancel(&run("m4"), "not needed").await.unwrap();
    let lease = store.claim(&run("m5"), &w, long()).await.unwrap();
    store.force_release(&run("m5")).await.unwrap();
    let _ = lease;
    let lease = store.claim(&run("m6"), &w, long()).await.unwrap();
    store.suspend(&lease).await.unwrap();
    store.resume(&run("m6")).await.unwrap();
    let leases = store
        .claim_next_in(&mail, &Kind::default(), &w, long(), 10)
        .await
        .unwrap();
    let mut claimed = ids(&leases);
    claimed.sort_unstable();
    assert_eq!(claimed, ["m5", "m6"]);
    assert!(leases
        .iter()
        .all(|l| l.queue() == &mail && l.priority() == 4));
    let record = store.inspect(&run("m6")).await.unwrap();
    assert_eq!((record.queue, record.priority), (mail, 4));
}
