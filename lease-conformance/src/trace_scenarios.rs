//! A run's trace context: the W3C `traceparent` it is created under goes with the run, from the
//! create to `inspect` and every claim's lease, alone and in a batch, renewals included, and is
//! absent from a run created without one.

use lease_core::{NewRun, TraceParent};

use crate::scenarios::{long, run, worker};
use crate::StoreFactory;

fn parent(n: u8) -> TraceParent {
    TraceParent::new(format!(
        "00-4bf92f3577b34da6a3ce929d0e0e47{n:02x}-00f067aa0ba902{n:02x}-01"
    ))
    .expect("a valid traceparent")
}

/// Created with a trace parent (`create_with`, `create_many_with`), a run keeps it: the
/// create's record, `inspect`, `inspect_many`, `claim`, `claim_next` and the renewed lease all
/// carry it, byte-exact; a run created without one carries none.
pub async fn a_runs_trace_parent_goes_from_its_create_to_every_claim(factory: &dyn StoreFactory) {
    let store = factory.fresh().await;
    let ttl = long();
    let created = store
        .create_with(&NewRun::new(run("traced")).with_trace_parent(parent(1)))
        .await
        .unwrap();
    assert_eq!(created.trace_parent, Some(parent(1)), "the create's record");
    store.create(&run("untraced")).await.unwrap();
    for result in store
        .create_many_with(&[
            NewRun::new(run("batch-a")).with_trace_parent(parent(2)),
            NewRun::new(run("batch-b")),
        ])
        .await
        .unwrap()
    {
        result.unwrap();
    }
    let expected = [
        ("traced", Some(parent(1))),
        ("untraced", None),
        ("batch-a", Some(parent(2))),
        ("batch-b", None),
    ];
    for (id, want) in &expected {
        let record = store.inspect(&run(id)).await.unwrap();
        assert_eq!(&record.trace_parent, want, "inspect of {id}");
    }
    let ids: Vec<_> = expected.iter().map(|(id, _)| run(id)).collect();
    for ((id, want), record) in expected.iter().zip(store.inspect_many(&ids).await.unwrap()) {
        assert_eq!(&record.unwrap().trace_parent, want, "inspect_many of {id}");
    }
    let lease = store
        .claim(&run("traced"), &worker("w"), ttl)
        .await
        .unwrap();
    assert_eq!(lease.trace_parent(), Some(&parent(1)), "claim");
    let renewed = store.renew(&lease).await.unwrap();
    assert_eq!(
        renewed.trace_parent(),
        Some(&parent(1)),
        "the renewed lease"
    );
    let mut claimed = store.claim_next(&worker("w"), ttl, 10).await.unwrap();
    claimed.sort_by(|a, b| a.run().as_str().cmp(b.run().as_str()));
    let got: Vec<(String, Option<TraceParent>)> = claimed
        .iter()
        .map(|l| (l.run().to_string(), l.trace_parent().cloned()))
        .collect();
    assert_eq!(
        got,
        [
            ("batch-a".to_owned(), Some(parent(2))),
            ("batch-b".to_owned(), None),
            ("untraced".to_owned(), None),
        ],
        "claim_next"
    );
}
