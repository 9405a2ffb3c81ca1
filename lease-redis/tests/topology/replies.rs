//! The replies that mean "not now" or "not here" are retryable, and the same store recovers:
//! `READONLY` from a demoted primary, `BUSY` while another client's script runs.

use std::time::{Duration, Instant};

use lease_conformance::assert_unavailable;
use lease_conformance::fixtures::{unique_namespace, RedisOptions};
use lease_core::LeaseStore;

use super::{connect, raw, retrying, run, say, server, ttl, worker};

/// A primary demoted to a replica answers writes with `READONLY`: a retryable `Unavailable`
/// (heartbeats keep trying through a failover instead of failing for good). Once it is a
/// primary again its data is the other server's, where the namespace's epoch is behind what
/// the store had seen: the namespace is refused as restored (its run is gone, and fences could
/// repeat) until a rebind, after which the same store works again above 2^32.
#[tokio::test]
async fn readonly_from_a_demoted_primary_is_retryable_and_the_store_recovers() {
    let Some(demoted) = server(RedisOptions::default()) else {
        return;
    };
    let Some(other) = server(RedisOptions::default()) else {
        return;
    };
    let ns = unique_namespace("readonly");
    let store = connect(&demoted.url(), &ns).await.unwrap();
    store.create(&run("before")).await.unwrap();

    let port = other.port().to_string();
    demoted.command(&["REPLICAOF", "127.0.0.1", &port]).unwrap();
    demoted
        .wait_synced_to(&other, Duration::from_secs(10))
        .unwrap();
    for attempt in 0..3 {
        let err = store.create(&run("during")).await.unwrap_err();
        assert_unavailable(&err, "redis");
        assert!(
            err.to_string().to_lowercase().contains("read only replica"),
            "attempt {attempt}: {err}"
        );
    }
    say(&format!(
        "READONLY: {}",
        store.create(&run("during")).await.unwrap_err()
    ));

    demoted.command(&["REPLICAOF", "NO", "ONE"]).unwrap();
    let r = run("after");
    let deadline = Instant::now() + Duration::from_secs(5);
    let refused = loop {
        match store.create(&r).await {
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            other => break other.expect_err("the replaced data must be refused"),
        }
    };
    super::assert_misconfigured(&refused, "lease redis-rebind");
    lease_redis::RedisLeaseStore::rebind(super::config(&demoted.url(), &ns))
        .await
        .unwrap();
    retrying(
        Duration::from_secs(5),
        "create on the primary again",
        || store.create(&r),
    )
    .await;
    let lease = store.claim(&r, &worker("w"), ttl(10_000)).await.unwrap();
    assert!(
        lease.fence().get() > lease_redis::REBIND_FENCE_STEP,
        "{}",
        lease.fence()
    );
}

/// While another client's long script keeps the server `BUSY`, operations fail with a
/// retryable `Unavailable`; once the script is killed the same store carries on.
#[tokio::test]
async fn busy_while_another_script_runs_is_retryable_and_the_store_recovers() {
    let Some(server) = server(RedisOptions::default().with_args(&["--busy-reply-threshold", "50"]))
    else {
        return;
    };
    let ns = unique_namespace("busy");
    let store = connect(&server.url(), &ns).await.unwrap();
    let r = run("r");
    store.create(&r).await.unwrap();

    let url = server.url();
    let spinning = tokio::spawn(async move {
        let mut conn = raw(&url).await;
        // Read-only and endless: only SCRIPT KILL ends it.
        let _ = redis::cmd("EVAL")
            .arg("local i = 0 while true do i = i + 1 end")
            .arg(0)
            .query_async::<redis::Value>(&mut conn)
            .await;
    });
    let mut probe = raw(&server.url()).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match redis::cmd("PING").query_async::<String>(&mut probe).await {
            Err(e) if e.code() == Some("BUSY") => break,
            _ => {
                assert!(Instant::now() < deadline, "the server never became BUSY");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    let err = store
        .claim(&r, &worker("a"), ttl(10_000))
        .await
        .unwrap_err();
    assert_unavailable(&err, "redis");
    assert!(err.to_string().contains("BUSY"), "{err}");
    say(&format!("BUSY: {err}"));

    let _: () = redis::cmd("SCRIPT")
        .arg("KILL")
        .query_async(&mut probe)
        .await
        .unwrap();
    spinning.await.unwrap();
    let a = worker("a");
    let lease = retrying(
        Duration::from_secs(5),
        "claim after the script ended",
        || store.claim(&r, &a, ttl(10_000)),
    )
    .await;
    assert_eq!(lease.fence().get(), 1, "the refused claim changed nothing");
}
