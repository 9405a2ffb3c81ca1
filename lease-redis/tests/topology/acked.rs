//! `replicas=N` on a primary whose replica's link is cut (a real partition, by iptables):
//! nothing is reported done that the promoted replica does not hold, a retry's "already ended
//! under your fence" included, and reads are not held up behind writes waiting for replicas.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_conformance::fixtures::{
    required, unique_namespace, LinkCut, RedisOptions, RedisServer, LINK_CUT_HINT,
};
use lease_conformance::{acked_scenarios, assert_unavailable};
use lease_core::LeaseStore;

use super::{connect, raw, run, say, server, ttl, worker};

/// A primary, and its replica replicating from `link` (an address only that link uses), in
/// sync.
fn primary_and_replica(link: &str) -> Option<(RedisServer, RedisServer)> {
    let primary = server(RedisOptions::default())?;
    let replica = server(
        RedisOptions::default()
            .with_replicaof(primary.port())
            .with_source_address(link),
    )?;
    replica
        .wait_synced_to(&primary, Duration::from_secs(10))
        .unwrap();
    Some((primary, replica))
}

/// Cuts the replica's link and proves it is cut: after a write, `WAIT 1 300` answers 0.
async fn cut_link(primary: &RedisServer, link: &str) -> Option<LinkCut> {
    let cut = required(
        "iptables",
        LinkCut::cut(link, primary.port()),
        LINK_CUT_HINT,
    )?;
    let mut conn = raw(&primary.url()).await;
    let _: i64 = redis::cmd("INCR")
        .arg("link-probe")
        .query_async(&mut conn)
        .await
        .unwrap();
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(300)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        acked, 0,
        "the replica still acknowledges: the link is not cut"
    );
    Some(cut)
}

/// SIGKILLs the primary and promotes the replica (`REPLICAOF NO ONE`), as a failover would.
fn fail_over(primary: &mut RedisServer, replica: &RedisServer) {
    primary.stop();
    replica.command(&["REPLICAOF", "NO", "ONE"]).unwrap();
    assert_eq!(replica.info("replication", "role").unwrap(), "master");
}

/// With `replicas=1&replica_timeout_ms=300` and the replica cut off, a `Worker` completing a
/// job reports it committed only if the replica has it: its first `end_many` is not
/// acknowledged, and its retries answer "already completed under your fence", which must be
/// confirmed like the first write (a barrier and `WAIT` on the same connection) and is not.
/// After the primary is SIGKILLed and the replica promoted, every run the Worker reported
/// committed is `Completed` there; a job completed before the cut is the control. The same for
/// `complete` called directly and retried, and for a `RunScope`'s complete and its retry
/// (`lease_conformance::acked_scenarios`).
#[tokio::test]
async fn nothing_reported_committed_is_missing_after_the_replica_is_promoted() {
    const LINK: &str = "127.0.0.7";
    let Some((mut primary, replica)) = primary_and_replica(LINK) else {
        return;
    };
    let ns = unique_namespace("acked");
    let url = format!("{}?replicas=1&replica_timeout_ms=300", primary.url());
    let store: Arc<dyn LeaseStore> = Arc::new(connect(&url, &ns).await.unwrap());
    let Some((seen, cut)) =
        acked_scenarios::ends_across_a_cut(store, "redis", || cut_link(&primary, LINK)).await
    else {
        return;
    };
    fail_over(&mut primary, &replica);
    drop(cut);
    let promoted = connect(&replica.url(), &ns).await.unwrap();
    let summary = acked_scenarios::assert_nothing_committed_was_lost(&seen, &promoted).await;
    say(&format!(
        "replicas=1, replica cut off, then promoted: {summary}"
    ));
}

/// With the replica cut off and six renewals blocked in `WAIT` (`replica_timeout_ms=1000`),
/// `inspect` answers within 100 ms: reads never queue behind another call's `WAIT`, which
/// blocks its own connection only. The renewals then fail as retryable `Unavailable`.
#[tokio::test]
async fn a_frozen_replica_does_not_hold_up_reads() {
    const LINK: &str = "127.0.0.8";
    let Some((primary, _replica)) = primary_and_replica(LINK) else {
        return;
    };
    let ns = unique_namespace("readsfree");
    let url = format!("{}?replicas=1&replica_timeout_ms=1000", primary.url());
    let store = Arc::new(connect(&url, &ns).await.unwrap());
    let runs: Vec<lease_core::RunId> = (0..6).map(|i| run(&format!("r{i}"))).collect();
    store.create_many(&runs).await.unwrap();
    let leases = store
        .claim_next(&worker("a"), ttl(60_000), 6)
        .await
        .unwrap();
    assert_eq!(leases.len(), 6);

    let Some(_cut) = cut_link(&primary, LINK).await else {
        return;
    };
    let renewals: Vec<_> = leases
        .iter()
        .cloned()
        .map(|lease| {
            let store = store.clone();
            tokio::spawn(async move { store.renew(&lease).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let asked = Instant::now();
    let record = store.inspect(&runs[0]).await.unwrap();
    let took = asked.elapsed();
    assert_eq!(record.fence.get(), 1);
    let mut outcomes = Vec::new();
    for renewal in renewals {
        let err = renewal.await.unwrap().unwrap_err();
        assert_unavailable(&err, "redis");
        outcomes.push(err.is_retryable());
    }
    say(&format!(
        "replica cut off, 6 renewals waiting for it: inspect answered in {took:?}; the \
         renewals failed retryable: {outcomes:?}"
    ));
    assert!(
        took < Duration::from_millis(100),
        "inspect took {took:?} behind the renewals' WAIT"
    );
}

/// A `create` whose first attempt was not acknowledged (the replica cut off) is retried: the
/// retry finds the run there, and "already exists" is confirmed like the first attempt's
/// creation, so it is not acknowledged either (before, a retry reported the enqueue done, and a
/// failover lost it). The same for `create_many` and `ensure`; after the heal the retry answers
/// `AlreadyExists`, now on the replica.
#[tokio::test]
async fn a_retried_create_never_confirms_less_than_the_first() {
    const LINK: &str = "127.0.0.9";
    let Some((primary, replica)) = primary_and_replica(LINK) else {
        return;
    };
    let ns = unique_namespace("recreate");
    let url = format!("{}?replicas=1&replica_timeout_ms=300", primary.url());
    let store = connect(&url, &ns).await.unwrap();
    let Some(cut) = cut_link(&primary, LINK).await else {
        return;
    };
    let r = run("enqueued");
    let first = store.create(&r).await.unwrap_err();
    assert_unavailable(&first, "redis");
    for retry in [
        store.create(&r).await.map(drop),
        store.create_many(std::slice::from_ref(&r)).await.map(drop),
        lease_core::LeaseStoreExt::ensure(&store, &r)
            .await
            .map(drop),
    ] {
        let err = retry.expect_err("a retry confirmed what the first attempt could not");
        assert_unavailable(&err, "redis");
        assert!(err.to_string().contains("replicas"), "{err}");
    }
    drop(cut);
    replica
        .wait_synced_to(&primary, Duration::from_secs(10))
        .unwrap();
    // Healed: a retry answers AlreadyExists once the replica acknowledges within the 300 ms
    // the URL allows. On a slow disk that may take a few tries; until then it stays
    // Unavailable, never a confirmation of less.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match store.create(&r).await {
            Err(lease_core::Error::AlreadyExists { .. }) => break,
            Err(e @ lease_core::Error::Unavailable { .. })
                if std::time::Instant::now() < deadline =>
            {
                assert!(e.to_string().contains("replicas"), "{e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => panic!("after the heal a retried create answered {other:?}"),
        }
    }
    say("replica cut: a retried create answered Unavailable, not AlreadyExists");
}
