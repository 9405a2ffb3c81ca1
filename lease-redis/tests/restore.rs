//! A restored Redis must not issue fences again: an RDB saved with `SAVE`, runs claimed after
//! it, the server killed and started again on the same port from the old RDB (real files).
//! A store that lived through the restore finds the epoch gone back and marks the namespace;
//! a store started after the restore is refused by the claiming scripts once the mark is set;
//! `rebind` makes both serve, every fence raised by 2^32.

use std::time::{Duration, Instant};

use lease_conformance::fixtures::{unavailable, unique_namespace, RedisOptions, RedisServer};
use lease_core::{Error, Lease, LeaseStore, RunId, Ttl, WorkerId};
use lease_redis::{RedisConfig, RedisLeaseStore, REBIND_FENCE_STEP};

const HINT: &str = "install redis-server (apt-get install redis-server)";

fn id(s: &str) -> RunId {
    RunId::new(s).unwrap()
}

fn worker(s: &str) -> WorkerId {
    WorkerId::new(s).unwrap()
}

fn ttl(ms: u64) -> Ttl {
    Ttl::from_millis(ms).unwrap()
}

/// An RDB-only server (no AOF: the RDB is what a restart loads), which the store accepts
/// only as volatile: said explicitly.
fn server() -> Option<RedisServer> {
    match RedisServer::start_options(RedisOptions::default().with_appendonly(false)) {
        Ok(server) => Some(server),
        Err(why) => unavailable("redis-server", why, HINT),
    }
}

fn config(server: &RedisServer, namespace: &str) -> RedisConfig {
    RedisConfig::from_url(format!("{}?volatile=true", server.url()))
        .with_namespace(namespace)
        .with_response_timeout(Duration::from_secs(5))
}

/// `call` until its answer is not retryable (the connection the restart cut fails first),
/// within 10 s.
async fn answered<T, F, Fut>(mut call: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match call().await {
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => return other,
        }
    }
}

/// The refusal of a restored namespace: configuration, naming the command that rebinds.
fn assert_refused<T: std::fmt::Debug>(result: Result<T, Error>, why: &str) {
    let err = result.expect_err("a restored namespace must be refused");
    assert!(
        matches!(
            err,
            Error::Misconfigured {
                backend: "redis",
                ..
            }
        ),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("lease redis-rebind --store redis://"),
        "{text}"
    );
    assert!(text.contains(why), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_rdb_is_refused_until_rebound() {
    let Some(mut server) = server() else {
        return;
    };
    let ns = unique_namespace("restore");
    let first = RedisLeaseStore::connect(config(&server, &ns))
        .await
        .unwrap();
    let (run, other) = (id("restored-run"), id("other-run"));
    first.create(&run).await.unwrap();
    first.create(&other).await.unwrap();
    let a = first.claim(&run, &worker("a"), ttl(100)).await.unwrap();
    assert_eq!(a.fence().get(), 1);

    // The backup, then more history: stores come and go (each increments the epoch), the
    // live one connects last, a's lease expires and the live store claims the run at fence
    // 2, which the backup lacks.
    server.command(&["SAVE"]).unwrap();
    let backup = server.dir().join("backup.rdb");
    std::fs::copy(server.dir().join("dump.rdb"), &backup).unwrap();
    for _ in 0..3 {
        drop(
            RedisLeaseStore::connect(config(&server, &ns))
                .await
                .unwrap(),
        );
    }
    let live = RedisLeaseStore::connect(config(&server, &ns))
        .await
        .unwrap();
    let (b, c) = (worker("b"), worker("c"));
    tokio::time::sleep(Duration::from_millis(150)).await;
    let lost: Lease = live.claim(&run, &worker("b"), ttl(60_000)).await.unwrap();
    assert_eq!(lost.fence().get(), 2);

    // The restore: the server killed, the old RDB put back, started on the same port.
    server.stop();
    std::fs::copy(&backup, server.dir().join("dump.rdb")).unwrap();
    server.restart().unwrap();

    // A process started after the restore connects (the namespace is not marked yet), and
    // the old code would hand it fence 2 again.
    let fresh = RedisLeaseStore::connect(config(&server, &ns))
        .await
        .unwrap();
    // The live store's next call is on a new connection: the epoch went back.
    assert_refused(
        answered(|| live.claim(&other, &b, ttl(60_000))).await,
        "the epoch went back",
    );
    assert_refused(
        fresh.claim(&run, &worker("c"), ttl(60_000)).await,
        "the epoch went back",
    );
    assert_refused(
        fresh.claim_next(&worker("c"), ttl(60_000), 10).await,
        "the epoch went back",
    );
    assert_refused(
        RedisLeaseStore::connect(config(&server, &ns)).await,
        "the epoch went back",
    );

    let rebound = RedisLeaseStore::rebind(config(&server, &ns)).await.unwrap();
    assert!(rebound.marker.is_some(), "{rebound:?}");
    assert_eq!(rebound.runs, 2, "{rebound:?}");
    assert_eq!(rebound.floor, REBIND_FENCE_STEP.to_string());

    let taken = answered(|| fresh.claim(&run, &c, ttl(60_000)))
        .await
        .expect("a store started after the restore serves once rebound");
    assert!(
        taken.fence().get() > REBIND_FENCE_STEP,
        "fence {} after a rebind",
        taken.fence()
    );
    let next = answered(|| live.claim(&other, &b, ttl(60_000)))
        .await
        .expect("the live store serves once rebound");
    assert!(next.fence().get() > REBIND_FENCE_STEP, "{}", next.fence());
    let stale = live.renew(&lost).await.unwrap_err();
    assert!(
        matches!(stale, Error::StaleFence { presented: 2, .. }),
        "{stale:?}"
    );
    // A new run starts above the raised floor too.
    let new_run = id("new-run");
    live.create(&new_run).await.unwrap();
    let lease = live
        .claim(&new_run, &worker("b"), ttl(60_000))
        .await
        .unwrap();
    assert!(lease.fence().get() > REBIND_FENCE_STEP, "{}", lease.fence());
}
