//! `sync_replicas=1` with the standby's link cut (a real partition, by iptables, not a stopped
//! standby): nothing is reported done that the promoted standby does not hold, a retry's
//! "already ended under your fence" included; and a confirmation asks the server that
//! committed, even when the store moves to another host between the commit and the check.
//!
//! These tests start their own servers. A server that cannot be started fails the test;
//! `LEASE_TEST_SKIP_SERVERS=1` skips instead.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_conformance::fixtures::{
    required, unique_namespace, with_params, LinkCut, PostgresServer, LINK_CUT_HINT,
};
use lease_conformance::{acked_scenarios, assert_unavailable};
use lease_core::LeaseStore;
use lease_postgres::{sqlx, PostgresConfig, PostgresLeaseStore};

mod support;
use support::{caught_up, execute, id, or_fail, ttl, worker};

/// The primary's address the standby replicates through: cutting it cuts that link alone.
const LINK: &str = "127.0.0.2";

fn config(url: &str, schema: &str) -> PostgresConfig {
    PostgresConfig::from_url(url)
        .with_schema(schema)
        .with_acquire_timeout(Duration::from_secs(2))
}

/// A primary requiring a synchronous standby (`synchronous_standby_names = '*'`), and that
/// standby, replicating through [`LINK`], caught up.
async fn primary_and_sync_standby() -> Option<(PostgresServer, PostgresServer)> {
    let primary = or_fail(PostgresServer::start(), "a primary")?;
    execute(
        &primary.url(),
        "ALTER SYSTEM SET synchronous_standby_names = '*'",
    )
    .await;
    execute(&primary.url(), "SELECT pg_reload_conf()").await;
    let standby = or_fail(PostgresServer::standby_of_via(&primary, LINK), "a standby")?;
    caught_up(&primary.url(), 1).await;
    Some((primary, standby))
}

/// Cuts the standby's link and proves it is cut: WAL written now does not reach the standby's
/// flush position within 500 ms.
async fn cut_standby(primary: &PostgresServer) -> Option<LinkCut> {
    use sqlx::Connection;
    let cut = required(
        "iptables",
        LinkCut::cut_to(LINK, primary.port()),
        LINK_CUT_HINT,
    )?;
    let mut conn = sqlx::PgConnection::connect(&primary.url()).await.unwrap();
    for sql in [
        "SET synchronous_commit = local",
        "CREATE TABLE IF NOT EXISTS public.cut_probe (at TIMESTAMPTZ NOT NULL)",
        "INSERT INTO public.cut_probe VALUES (now())",
    ] {
        sqlx::query(sql).execute(&mut conn).await.unwrap();
    }
    let target: String = sqlx::query_scalar("SELECT pg_current_wal_flush_lsn()::text")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let flushed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_replication WHERE flush_lsn >= $1::pg_lsn",
    )
    .bind(&target)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(flushed, 0, "the standby still flushes: the link is not cut");
    conn.close().await.unwrap();
    Some(cut)
}

/// With `sync_replicas=1&sync_timeout_ms=300` and the standby's link cut, a `Worker` completing
/// a job reports it committed only if the standby has it: its first `end_many` is not
/// confirmed, and its retries answer "already completed under your fence", which must be
/// confirmed like the first write and is not. After the primary is killed and the standby
/// promoted, every run the Worker reported committed is `Completed` there; a job completed
/// before the cut is the control. The same for `complete` called directly and retried, and for
/// a `RunScope`'s complete and its retry (`lease_conformance::acked_scenarios`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_reported_committed_is_missing_after_the_standby_is_promoted() {
    let Some((primary, standby)) = primary_and_sync_standby().await else {
        return;
    };
    let schema = unique_namespace("acked");
    let url = with_params(&primary.url(), "sync_replicas=1&sync_timeout_ms=300");
    let store: Arc<dyn LeaseStore> = Arc::new(
        PostgresLeaseStore::connect(config(&url, &schema))
            .await
            .unwrap(),
    );
    let Some((seen, cut)) =
        acked_scenarios::ends_across_a_cut(store, "postgres", || cut_standby(&primary)).await
    else {
        return;
    };
    primary.kill().unwrap();
    standby.promote().unwrap();
    drop(cut);
    let promoted =
        PostgresLeaseStore::connect(config(&standby.url(), &schema).with_migrations(false))
            .await
            .unwrap();
    let summary = acked_scenarios::assert_nothing_committed_was_lost(&seen, &promoted).await;
    eprintln!("sync_replicas=1, standby cut off, then promoted: {summary}");
}

/// Two primaries, A and B, each with a synchronous standby; the store lists both hosts and
/// works on A. With A's standby cut off, a `complete` waits for it and is then committed on A
/// alone; while it waits, the store's idle connections to A are terminated and a concurrent
/// call moves the store to B, whose standby is streaming. The completion's confirmation must
/// still ask A (on the connection that committed) and refuse, never find B's standby caught up
/// with B's own WAL and report the completion done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmation_asks_the_server_that_committed_even_after_a_host_switch() {
    let Some((a, _a_standby)) = primary_and_sync_standby().await else {
        return;
    };
    let Some(b) = or_fail(PostgresServer::start(), "a second primary") else {
        return;
    };
    execute(&b.url(), "ALTER SYSTEM SET synchronous_standby_names = '*'").await;
    execute(&b.url(), "SELECT pg_reload_conf()").await;
    let Some(_b_standby) = or_fail(PostgresServer::standby_of(&b), "a standby of B") else {
        return;
    };
    caught_up(&b.url(), 1).await;

    let schema = unique_namespace("confirm_host");
    // The same schema on B, so the store can work there once it moves.
    let on_b = PostgresLeaseStore::connect(config(&b.url(), &schema))
        .await
        .unwrap();
    drop(on_b);
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?volatile=true&sync_replicas=1&sync_timeout_ms=1500",
        a.port(),
        b.port()
    );
    let store = Arc::new(
        PostgresLeaseStore::connect(config(&url, &schema).with_max_connections(4))
            .await
            .unwrap(),
    );
    let run = id("r");
    store.create(&run).await.unwrap();
    let lease = store.claim(&run, &worker("a"), ttl(60_000)).await.unwrap();
    // Idle connections in the pool, to be terminated.
    for _ in 0..3 {
        store.inspect(&run).await.unwrap();
    }

    let Some(_cut) = cut_standby(&a).await else {
        return;
    };
    let completing = {
        let (store, lease) = (store.clone(), lease.clone());
        tokio::spawn(async move { store.complete(&lease).await })
    };
    // Let the completion reach its wait for A's standby, then kill the store's other
    // sessions on A and make a call on one of them: it fails and the store moves to B.
    tokio::time::sleep(Duration::from_millis(300)).await;
    execute(
        &a.url(),
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name LIKE 'lease-postgres %' AND wait_event IS DISTINCT FROM 'SyncRep' \
         AND pid <> pg_backend_pid()",
    )
    .await;
    let mut moved = false;
    for _ in 0..10 {
        match store.inspect(&run).await {
            Err(e) if e.is_retryable() => {
                moved = true;
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    let answer = completing.await.unwrap();
    eprintln!(
        "host switch during a sync wait (a call failed on A: {moved}): complete answered \
         {answer:?}"
    );
    let err = answer.expect_err("a completion A's standby never flushed was reported done");
    assert!(err.is_retryable(), "{err:?}");
    assert!(
        err.to_string()
            .contains("only 0 of sync_replicas=1 synchronous standbys flushed it"),
        "the confirmation, asked of A, must be what refused: {err}"
    );
    // What B says: the run is not there at all, so nothing was confirmed there.
    let b_store = PostgresLeaseStore::connect(config(&b.url(), &schema).with_migrations(false))
        .await
        .unwrap();
    assert!(b_store.inspect(&run).await.is_err());
}

/// A store that worked with `sync_replicas=1` meets a server whose
/// `synchronous_standby_names` became empty (as a standby promoted without it would be): each
/// write is then a retryable `Unavailable` naming the setting, not a `Misconfigured` that
/// would cancel every scope at once; a store connecting afresh to that server is
/// `Misconfigured`, which is a configuration mistake at that point.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_list_emptied_under_a_working_store_is_retryable() {
    let Some((primary, _standby)) = primary_and_sync_standby().await else {
        return;
    };
    let schema = unique_namespace("emptied");
    let url = with_params(&primary.url(), "sync_replicas=1&sync_timeout_ms=500");
    let store = PostgresLeaseStore::connect(config(&url, &schema))
        .await
        .unwrap();
    let (r, s) = (id("r"), id("s"));
    store.create(&r).await.unwrap();
    store.create(&s).await.unwrap();
    store.claim(&r, &worker("a"), ttl(60_000)).await.unwrap();

    execute(
        &primary.url(),
        "ALTER SYSTEM SET synchronous_standby_names = ''",
    )
    .await;
    execute(&primary.url(), "SELECT pg_reload_conf()").await;
    // The store's sessions end, so the next call opens (and checks) a new one.
    execute(
        &primary.url(),
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name LIKE 'lease-postgres %'",
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let err = loop {
        let err = store
            .claim(&s, &worker("b"), ttl(60_000))
            .await
            .expect_err("a claim with no synchronous standby configured");
        if err
            .to_string()
            .contains("synchronous_standby_names is empty")
            || Instant::now() > deadline
        {
            break err;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_unavailable(&err, "postgres");
    assert!(
        err.to_string()
            .contains("synchronous_standby_names is empty"),
        "{err}"
    );
    let fresh = PostgresLeaseStore::connect(config(&url, &schema))
        .await
        .unwrap_err();
    assert!(
        matches!(fresh, lease_core::Error::Misconfigured { .. }),
        "a fresh store is pointed at a misconfigured server: {fresh:?}"
    );
    eprintln!("standby list emptied: a working store gets {err}; a fresh one {fresh}");
}
