//! Waits for a signal on Redis, beyond the conformance scenarios: a waiting run's member in its
//! class's claimable index (scored by the wait's deadline) leaves `count` saying it is
//! suspended, before and after the deadline, until a claim takes it; `claim_next` takes a
//! timed-out wait in its priority's order. On REDIS_URL or a private redis-server.

use std::time::Duration;

use lease_core::{End, Kind, LeaseStoreExt, NewRun, RunId, Ttl, WaitEnd, WorkerId};

fn run(id: &str) -> RunId {
    RunId::new(id).unwrap()
}

fn worker() -> WorkerId {
    WorkerId::new("w").unwrap()
}

fn ttl() -> Ttl {
    Ttl::from_millis(60_000).unwrap()
}

#[tokio::test]
async fn a_waiting_run_counts_suspended_until_a_claim_takes_it_timed_out() {
    let Some(factory) = lease_conformance::fixtures::redis().await else {
        return;
    };
    let store = factory.fresh().await;
    let kind = Kind::new("approvals").unwrap();
    store
        .create_with(&NewRun::new(run("low")).with_kind(kind.clone()))
        .await
        .unwrap();
    store
        .create_with(
            &NewRun::new(run("high"))
                .with_kind(kind.clone())
                .with_priority(5),
        )
        .await
        .unwrap();
    let leases = store
        .claim_next_kind(&kind, &worker(), ttl(), 2)
        .await
        .unwrap();
    assert_eq!(leases.len(), 2);
    for lease in &leases {
        store
            .end_one(
                lease,
                End::await_signal("approval", Duration::from_millis(400)).unwrap(),
            )
            .await
            .unwrap();
    }
    let counts = store.count().await.unwrap();
    assert_eq!(
        (
            counts.suspended,
            counts.held,
            counts.claimable,
            counts.delayed
        ),
        (2, 0, 0, 0),
        "{counts:?}"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    let counts = store.count().await.unwrap();
    assert_eq!(
        (counts.suspended, counts.held, counts.claimable),
        (2, 0, 0),
        "past the deadline, still suspended until claimed: {counts:?}"
    );
    let taken = store
        .claim_next_kind(&kind, &worker(), ttl(), 1)
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].run().as_str(), "high", "priority 5 first");
    assert!(matches!(taken[0].resumed(), Some(WaitEnd::TimedOut { .. })));
    assert_eq!(taken[0].attempt(), 1, "a fresh budget");
    let counts = store.count().await.unwrap();
    assert_eq!(
        (counts.suspended, counts.held, counts.claimable),
        (1, 1, 0),
        "{counts:?}"
    );
    let renewed = store.renew(&taken[0]).await.unwrap();
    assert_eq!(
        renewed.resumed(),
        taken[0].resumed(),
        "a renewal carries it"
    );
    let record = store.inspect(&run("high")).await.unwrap();
    assert_eq!(record.wait, None);
    assert!(matches!(record.resumed, Some(WaitEnd::TimedOut { .. })));
    let low = store.inspect(&run("low")).await.unwrap();
    assert!(low.wait.is_some(), "{low:?}");
}
