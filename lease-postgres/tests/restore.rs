//! A restored database must not issue fences again: a store refuses a server whose history
//! went back (another system identifier, another timeline) until `rebind` raises every fence
//! past anything the old history issued. One test restores a real base backup by
//! point-in-time recovery on the primary's port, under a store that stays alive; one
//! rewrites the binding row, as another cluster would look.
//!
//! These tests start their own servers. A server that cannot be started fails the test;
//! `LEASE_TEST_SKIP_SERVERS=1` skips instead.

use std::time::{Duration, Instant};

use lease_conformance::fixtures::{unique_namespace, PostgresServer};
use lease_core::{Error, Lease, LeaseStore, RunId};
use lease_postgres::{sqlx, PostgresConfig, PostgresLeaseStore, REBIND_FENCE_STEP};

mod support;
use support::{execute, id, or_fail, ttl, worker};

fn config(url: &str, schema: &str) -> PostgresConfig {
    PostgresConfig::from_url(url)
        .with_schema(schema)
        .with_acquire_timeout(Duration::from_secs(2))
}

/// Claims `run` through `store` until the answer is not a retryable error (the connections
/// of the server that went away fail first), within 20 s.
async fn claim_when_answered(store: &PostgresLeaseStore, run: &RunId) -> Result<Lease, Error> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match store.claim(run, &worker("after"), ttl(60_000)).await {
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => return other,
        }
    }
}

/// The refusal a restored server gets: configuration, naming the command that rebinds.
fn assert_refused(result: Result<Lease, Error>, why: &str) -> String {
    let err = result.expect_err("a restored server must be refused");
    let text = err.to_string();
    assert!(
        matches!(
            err,
            Error::Misconfigured {
                backend: "postgres",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        text.contains("lease pg-rebind --store postgres://"),
        "{text}"
    );
    assert!(text.contains(why), "{text}");
    text
}

/// A point-in-time recovery of a base backup, taken after a claim at fence 1 and before the
/// claim at fence 2, is put in the primary's place (same port) under a live store: the store
/// refuses it (timeline 1 recorded, 2 now), and so does a new store, where the old code
/// handed fence 2 out a second time. After `rebind`, the run is claimed above 2^32 and the
/// holder of the lost fence 2 is refused by the fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_point_in_time_recovery_is_refused_until_rebound() {
    let Some(primary) = or_fail(PostgresServer::start(), "a primary") else {
        return;
    };
    let schema = unique_namespace("restore_pitr");
    let store = PostgresLeaseStore::connect(config(&primary.url(), &schema))
        .await
        .unwrap();
    let run = id("restored-run");
    store.create(&run).await.unwrap();
    let first = store.claim(&run, &worker("a"), ttl(100)).await.unwrap();
    assert_eq!(first.fence().get(), 1);

    let backup = PostgresServer::backup_of(&primary).unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await; // a's lease expires
    let lost = store.claim(&run, &worker("b"), ttl(60_000)).await.unwrap();
    assert_eq!(
        lost.fence().get(),
        2,
        "b holds fence 2, which the backup lacks"
    );

    primary.stop().unwrap();
    backup.start_recovered().unwrap();

    let refused = assert_refused(
        claim_when_answered(&store, &run).await,
        "on timeline 1, but",
    );
    assert!(refused.contains("is on timeline 2"), "{refused}");
    let fresh = PostgresLeaseStore::connect(config(&backup.url(), &schema)).await;
    let err = fresh.expect_err("a new store is refused too");
    assert!(err.to_string().contains("lease pg-rebind"), "{err}");

    let rebound = PostgresLeaseStore::rebind(config(&backup.url(), &schema))
        .await
        .unwrap();
    assert_eq!(rebound.before.map(|b| b.1), Some(1));
    assert_eq!(rebound.after.1, 2);
    assert_eq!(rebound.runs, 1);

    let after = claim_when_answered(&store, &run)
        .await
        .expect("the live store serves once rebound");
    assert!(
        after.fence().get() > REBIND_FENCE_STEP,
        "fence {} after a rebind",
        after.fence()
    );
    let stale = store.renew(&lost).await.unwrap_err();
    assert!(
        matches!(stale, Error::StaleFence { presented, .. } if presented == 2),
        "{stale:?}"
    );
}

/// The binding row rewritten to another system identifier (the schema of another cluster,
/// restored here by dump and restore): a live store's new connections are refused with both
/// identifiers, a new store cannot connect, `rebind` reports what it replaced and the run
/// claimed before at fence 1 is claimed after at a fence above 2^32.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_clusters_schema_is_refused_until_rebound() {
    let Some(server) = or_fail(PostgresServer::start(), "a server") else {
        return;
    };
    let schema = unique_namespace("restore_other");
    let store = PostgresLeaseStore::connect(config(&server.url(), &schema))
        .await
        .unwrap();
    let run = id("moved-run");
    store.create(&run).await.unwrap();
    let held = store.claim(&run, &worker("a"), ttl(100)).await.unwrap();
    assert_eq!(held.fence().get(), 1);

    let system: i64 = {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(&server.url()).await.unwrap();
        sqlx::query_scalar("SELECT system_identifier FROM pg_control_system()")
            .fetch_one(&mut conn)
            .await
            .unwrap()
    };
    execute(
        &server.url(),
        &format!(
            "UPDATE \"{schema}\".cluster_binding SET system_identifier = {}",
            system ^ 1
        ),
    )
    .await;
    // As a restore would: the server's sessions end, the store's next ones are new.
    execute(
        &server.url(),
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name LIKE 'lease-postgres %'",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(150)).await; // a's lease expires

    assert_refused(
        claim_when_answered(&store, &run).await,
        &format!("system identifier {}", system ^ 1),
    );
    let err = PostgresLeaseStore::connect(config(&server.url(), &schema))
        .await
        .expect_err("a new store is refused too");
    assert!(
        err.to_string().contains("another database cluster"),
        "{err}"
    );

    let rebound = PostgresLeaseStore::rebind(config(&server.url(), &schema))
        .await
        .unwrap();
    assert_eq!(rebound.before.map(|b| b.0), Some(system ^ 1));
    assert_eq!(rebound.after.0, system);
    let after = claim_when_answered(&store, &run).await.unwrap();
    assert!(
        after.fence().get() > REBIND_FENCE_STEP,
        "fence {} after a rebind",
        after.fence()
    );
    // A second rebind raises again: the step is applied each time, never undone.
    let again = PostgresLeaseStore::rebind(config(&server.url(), &schema))
        .await
        .unwrap();
    assert_eq!(again.floor, 2 * REBIND_FENCE_STEP as i64);
}
