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
use support::{accept_failover, caught_up, execute, id, or_fail, ttl, worker};

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
    accept_failover(&standby.url(), &schema).await;
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

/// The caller's table in `schema`: `payments(run_id, fence)`, created through `url`.
async fn payments_table(url: &str, schema: &str) -> String {
    let table = format!("\"{schema}\".payments");
    execute(
        url,
        &format!("CREATE TABLE {table} (run_id TEXT PRIMARY KEY, fence BIGINT NOT NULL)"),
    )
    .await;
    table
}

/// The caller's exactly-once pattern on `conn`, committed **asynchronously**: `fence_in`, the
/// payment, `end_in`, then `SET LOCAL synchronous_commit = off` (a role default or a caller's
/// own choice), commit. The commit returns before its WAL is flushed, let alone on a standby.
async fn pay_asynchronously(
    store: &PostgresLeaseStore,
    conn: &mut sqlx::PgConnection,
    table: &str,
    lease: &lease_core::Lease,
) {
    use sqlx::Connection;
    let mut tx = conn.begin().await.unwrap();
    store.fence_in(&mut tx, lease).await.unwrap();
    sqlx::query(&format!("INSERT INTO {table} VALUES ($1, $2)"))
        .bind(lease.run().as_str())
        .bind(lease.fence().get() as i64)
        .execute(&mut *tx)
        .await
        .unwrap();
    store
        .end_in(&mut tx, lease, lease_core::End::Complete)
        .await
        .unwrap();
    sqlx::query("SET LOCAL synchronous_commit = off")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

/// A caller commits its payment and the run's completion in one transaction that it commits
/// asynchronously, then asks `confirm_in`; a `Worker` handler does the same and returns
/// `End::Committed`. Each is reported done only once the synchronous standby has it: the
/// primary is killed right after (an immediate stop, which loses WAL not yet flushed) and the
/// standby promoted, and both payments and both completions are there. The WAL writer is made
/// slow (`wal_writer_delay = 10s`, just after a flush) so that only a flush the store asks for
/// brings an asynchronous commit to the standby in time; before, the confirmation waited for
/// the standby to reach the primary's *flush* position, which an asynchronous commit is past,
/// and the Worker only read the run back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asynchronous_commit_is_reported_done_only_once_the_standby_has_it() {
    let Some((primary, standby)) = primary_and_sync_standby().await else {
        return;
    };
    execute(&primary.url(), "ALTER SYSTEM SET wal_writer_delay = '10s'").await;
    execute(&primary.url(), "SELECT pg_reload_conf()").await;
    let schema = unique_namespace("async_commit");
    let url = with_params(&primary.url(), "sync_replicas=1&sync_timeout_ms=2000");
    let store = Arc::new(
        PostgresLeaseStore::connect(config(&url, &schema))
            .await
            .unwrap(),
    );
    let table = payments_table(&primary.url(), &schema).await;
    let (direct, handled) = (id("direct"), id("handled"));
    store.create(&direct).await.unwrap();
    store.create(&handled).await.unwrap();
    let lease = store
        .claim(&direct, &worker("caller"), ttl(60_000))
        .await
        .unwrap();
    // The WAL writer flushes now; for the next 10 s it only writes.
    execute(&primary.url(), "SELECT pg_current_xact_id()").await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let worker_store = store.clone();
    let handler_table = table.clone();
    let w = lease_runtime::Worker::new(
        store.clone() as Arc<dyn LeaseStore>,
        worker("w"),
        lease_runtime::WorkerConfig::new(ttl(60_000)).with_poll_interval(Duration::from_millis(10)),
    )
    .unwrap();
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    let w = w.on_end(move |report| {
        let _ = done_tx.send((report.lease.run().to_string(), report.result.is_ok()));
    });
    let shutdown = lease_runtime::CancellationToken::new();
    let running = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            w.run(
                move |ctx: lease_runtime::RunContext| {
                    let (store, table) = (worker_store.clone(), handler_table.clone());
                    async move {
                        let mut conn = store.pool().acquire().await?;
                        pay_asynchronously(&store, &mut conn, &table, &ctx.lease()).await;
                        Ok(lease_core::End::Committed(lease_core::Ended::Completed))
                    }
                },
                shutdown,
            )
            .await
        })
    };
    let (run, ok) = tokio::time::timeout(Duration::from_secs(5), done_rx.recv())
        .await
        .expect("the Worker decided the handler's end")
        .unwrap();
    assert_eq!((run.as_str(), ok), ("handled", true));
    shutdown.cancel();
    let report = running.await.unwrap().unwrap();
    assert_eq!(report.completed, 1, "{report:?}");

    let mut conn = store.pool().acquire().await.unwrap();
    pay_asynchronously(&store, &mut conn, &table, &lease).await;
    store.confirm_in(&mut conn).await.unwrap();

    // Both reported done: kill the primary now, before its WAL writer would flush.
    primary.kill().unwrap();
    standby.promote().unwrap();
    accept_failover(&standby.url(), &schema).await;
    let promoted =
        PostgresLeaseStore::connect(config(&standby.url(), &schema).with_migrations(false))
            .await
            .unwrap();
    for run in [&direct, &handled] {
        let record = promoted.inspect(run).await.unwrap();
        assert_eq!(
            (record.state, record.fence.get()),
            (lease_core::RunState::Completed, 1),
            "{run}: reported done, lost on failover"
        );
        let paid: Option<i64> =
            sqlx::query_scalar(&format!("SELECT fence FROM {table} WHERE run_id = $1"))
                .bind(run.as_str())
                .fetch_optional(promoted.pool())
                .await
                .unwrap();
        assert_eq!(paid, Some(1), "{run}: its payment was lost on failover");
    }
}

/// With the standby cut off, a caller's own commit on `store.pool()` waits for it; the store's
/// own write meanwhile outlives the sync timeout, and the store cancels **its own** wait only:
/// the caller's commit is still waiting after the store's write gave up (before, the store
/// cancelled every session of its name, and Postgres then reported the caller's commit done
/// without the standby). Once the link heals the caller's commit completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_never_cancels_a_callers_wait_for_the_standby() {
    let Some((primary, _standby)) = primary_and_sync_standby().await else {
        return;
    };
    let schema = unique_namespace("callers_wait");
    let url = with_params(&primary.url(), "sync_replicas=1&sync_timeout_ms=300");
    let store = Arc::new(
        PostgresLeaseStore::connect(config(&url, &schema))
            .await
            .unwrap(),
    );
    let table = payments_table(&primary.url(), &schema).await;
    let Some(cut) = cut_standby(&primary).await else {
        return;
    };
    let committing = {
        let (pool, table) = (store.pool().clone(), table.clone());
        tokio::spawn(async move {
            let mut tx = pool.begin().await.unwrap();
            sqlx::query(&format!("INSERT INTO {table} VALUES ('mine', 1)"))
                .execute(&mut *tx)
                .await
                .unwrap();
            tx.commit().await
        })
    };
    // The caller's commit is waiting for the standby.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep' \
             AND query = 'COMMIT'",
        )
        .fetch_one(store.pool())
        .await
        .unwrap();
        if waiting == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the caller's commit never waited"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let err = store.create(&id("ours")).await.unwrap_err();
    assert_unavailable(&err, "postgres");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !committing.is_finished(),
        "the caller's commit returned without its standby: the store cancelled its wait"
    );
    drop(cut);
    tokio::time::timeout(Duration::from_secs(20), committing)
        .await
        .expect("the caller's commit completes once the standby is back")
        .unwrap()
        .unwrap();
}

/// A `create` whose first attempt was not confirmed (the standby cut off) is retried: the retry
/// finds the run there, and "already exists" is confirmed like the first attempt's creation,
/// so it is not reported either (before, a retry reported the enqueue done, and a failover lost
/// it). The same for `create_many` and `ensure`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_create_never_confirms_less_than_the_first() {
    let Some((primary, _standby)) = primary_and_sync_standby().await else {
        return;
    };
    let schema = unique_namespace("recreate");
    let url = with_params(&primary.url(), "sync_replicas=1&sync_timeout_ms=300");
    let store = PostgresLeaseStore::connect(config(&url, &schema))
        .await
        .unwrap();
    let Some(_cut) = cut_standby(&primary).await else {
        return;
    };
    let r = id("enqueued");
    let first = store.create(&r).await.unwrap_err();
    assert_unavailable(&first, "postgres");
    for retry in [
        store.create(&r).await.map(drop),
        store.create_many(std::slice::from_ref(&r)).await.map(drop),
        lease_core::LeaseStoreExt::ensure(&store, &r)
            .await
            .map(drop),
    ] {
        let err = retry.expect_err("a retry confirmed what the first attempt could not");
        assert_unavailable(&err, "postgres");
        assert!(err.to_string().contains("sync_replicas"), "{err}");
    }
}

/// The scenario of a caller who turns synchronous commit off on a session of its own for
/// good (`SET synchronous_commit = off`, session-level, inside a fenced transaction, and on a
/// pool given to `from_pool`), then leaves the session to the pool: the store's next claim is
/// still committed synchronously and confirmed on the standby. The primary is killed right
/// after the claim returns, its WAL writer slowed so that only a synchronous commit reaches the
/// standby in time, and the promoted standby holds the claim. Before, fenced transactions and
/// `from_pool` stores ran on the same sessions as the store's writes, and the claim, committed
/// asynchronously and confirmed against the flush position it was past, was lost.
async fn a_callers_session_setting_never_weakens_a_claim(over_pool: bool) {
    let Some((primary, standby)) = primary_and_sync_standby().await else {
        return;
    };
    execute(&primary.url(), "ALTER SYSTEM SET wal_writer_delay = '10s'").await;
    execute(&primary.url(), "SELECT pg_reload_conf()").await;
    let schema = unique_namespace(if over_pool {
        "poisoned_pool"
    } else {
        "poisoned_tx"
    });
    let url = with_params(&primary.url(), "sync_replicas=1&sync_timeout_ms=2000");
    let store = if over_pool {
        let plain = primary.url().split('?').next().unwrap().to_owned();
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(&plain)
            .await
            .unwrap();
        sqlx::query("SET synchronous_commit = off")
            .execute(&pool)
            .await
            .unwrap();
        PostgresLeaseStore::from_pool(
            pool,
            PostgresConfig::for_pool()
                .with_schema(&schema)
                .with_volatile(true)
                .with_sync_replicas(1)
                .with_sync_timeout(Duration::from_secs(2)),
        )
        .await
        .unwrap()
    } else {
        PostgresLeaseStore::connect(config(&url, &schema).with_max_connections(1))
            .await
            .unwrap()
    };
    let (a, b) = (id("a"), id("b"));
    store.create(&a).await.unwrap();
    store.create(&b).await.unwrap();
    if !over_pool {
        let lease = store.claim(&a, &worker("w"), ttl(60_000)).await.unwrap();
        let mut tx = store.fenced_transaction(&lease).await.unwrap();
        sqlx::query("SET synchronous_commit = off")
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    // The WAL writer flushes now; for the next 10 s it only writes.
    execute(&primary.url(), "SELECT pg_current_xact_id()").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let claimed = store.claim(&b, &worker("w"), ttl(60_000)).await.unwrap();
    assert_eq!(claimed.fence().get(), 1);
    primary.kill().unwrap();
    standby.promote().unwrap();
    accept_failover(&standby.url(), &schema).await;
    let promoted =
        PostgresLeaseStore::connect(config(&standby.url(), &schema).with_migrations(false))
            .await
            .unwrap();
    let record = promoted.inspect(&b).await.unwrap();
    assert_eq!(
        (record.fence.get(), record.owner.is_some()),
        (1, true),
        "a claim handed out was lost on failover: its fence would be issued again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_transactions_session_setting_never_weakens_a_claim() {
    a_callers_session_setting_never_weakens_a_claim(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pools_session_setting_never_weakens_a_claim() {
    a_callers_session_setting_never_weakens_a_claim(true).await;
}
