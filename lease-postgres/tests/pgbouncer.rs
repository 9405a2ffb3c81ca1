//! The store behind PgBouncer in transaction mode (`pool_mode = transaction`, the URL's
//! `pooler=transaction`): the whole conformance suite, a Worker draining a queue, group-committed
//! effects exactly once, wake-ups over a direct `listen_url`, and the settings another client
//! leaves on a shared server session, which must not reach the store's transactions.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_conformance::fixtures::{
    pgbouncer_url, postgres_url, required, unique_namespace, PgBouncer, PGBOUNCER_HINT,
};
use lease_core::{BoxError, End, Error, LeaseStore, RunId, RunState, Ttl, WorkerId};
use lease_postgres::sqlx::{self, Connection};
use lease_postgres::{PgEffect, PostgresConfig, PostgresLeaseStore};
use lease_runtime::{CancellationToken, RetryPolicy, RunContext, Worker, WorkerConfig};

lease_conformance::conformance_tests!(lease_conformance::fixtures::pgbouncer());

fn id(s: &str) -> RunId {
    RunId::new(s).unwrap()
}

async fn pooled_store(url: &str) -> PostgresLeaseStore {
    let config = PostgresConfig::from_url(url)
        .with_schema(unique_namespace("lease_pgb"))
        .with_max_connections(8);
    PostgresLeaseStore::connect(config)
        .await
        .expect("a store through the pooler")
}

/// Waits until `store` counts `n` completed runs, failing after `limit`.
async fn until_completed(store: &dyn LeaseStore, n: u64, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let counts = store.count().await.unwrap();
        if counts.completed >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {n} runs completed within {limit:?}: {counts:?}",
            counts.completed
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_drains_a_queue_through_the_pooler_at_fence_one() {
    let Some(url) = pgbouncer_url().await else {
        return;
    };
    let store = Arc::new(pooled_store(&url).await);
    let runs: Vec<RunId> = (0..300).map(|i| id(&format!("drain-{i:03}"))).collect();
    for result in store.create_many(&runs).await.unwrap() {
        result.unwrap();
    }
    let config = WorkerConfig::new(Ttl::from_secs(30).unwrap())
        .with_concurrency(16)
        .with_batch(16, Duration::from_millis(2));
    let worker = Worker::new(store.clone(), WorkerId::new("pgb").unwrap(), config).unwrap();
    let shutdown = CancellationToken::new();
    let handler = |_ctx: RunContext| async move { Ok::<_, BoxError>(End::Complete) };
    let serving = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { worker.run(handler, shutdown).await }
    });
    until_completed(&*store, 300, Duration::from_secs(60)).await;
    shutdown.cancel();
    let report = serving.await.unwrap().unwrap();
    assert_eq!(report.completed, 300, "{report:?}");
    assert_eq!(
        (report.refused, report.failed, report.handler_errors),
        (0, 0, 0),
        "{report:?}"
    );
    for record in store.inspect_many(&runs).await.unwrap() {
        let record = record.unwrap();
        assert_eq!(
            (record.state, record.fence.get()),
            (RunState::Completed, 1),
            "{}: one claim, one completion",
            record.run
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_committed_effects_run_once_each_through_the_pooler() {
    let Some(url) = pgbouncer_url().await else {
        return;
    };
    let store = Arc::new(pooled_store(&url).await);
    // DDL in one simple-protocol message: no statement to prepare across the pooler.
    sqlx::raw_sql(&format!(
        "CREATE TABLE \"{}\".payments (run_id TEXT PRIMARY KEY, fence BIGINT NOT NULL)",
        store.schema()
    ))
    .execute(store.pool())
    .await
    .expect("the payments table");
    let runs: Vec<RunId> = (0..60).map(|i| id(&format!("pay-{i:02}"))).collect();
    for result in store.create_many(&runs).await.unwrap() {
        result.unwrap();
    }
    let insert = format!(
        "INSERT INTO \"{}\".payments (run_id, fence) VALUES ($1, $2)",
        store.schema()
    );
    let config = WorkerConfig::new(Ttl::from_secs(30).unwrap())
        .with_concurrency(8)
        .with_batch(16, Duration::from_millis(5))
        .with_retry(
            RetryPolicy::default()
                .with_backoff(Duration::from_millis(10), Duration::from_millis(20)),
        );
    let worker = Worker::new(store.clone(), WorkerId::new("pgb").unwrap(), config).unwrap();
    let shutdown = CancellationToken::new();
    let handler = move |ctx: RunContext| {
        let insert = insert.clone();
        async move {
            let run = ctx.run().to_string();
            let fence = ctx.fence().get() as i64;
            if ctx.attempt() == 1 && run.ends_with('0') {
                // A first attempt that writes its effect, then fails: its savepoint is rolled
                // back, its lease retried under the next fence.
                ctx.set_effect(PgEffect::new(move |conn| {
                    let (insert, run) = (insert.clone(), run.clone());
                    Box::pin(async move {
                        sqlx::query(&insert)
                            .persistent(false)
                            .bind(run)
                            .bind(fence)
                            .execute(&mut *conn)
                            .await?;
                        Err("the first attempt fails after its write".into())
                    })
                }))?;
            } else {
                ctx.set_effect(PgEffect::statement(&*insert, [run.into(), fence.into()]))?;
            }
            Ok::<_, BoxError>(End::Complete)
        }
    };
    let serving = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { worker.run(handler, shutdown).await }
    });
    until_completed(&*store, 60, Duration::from_secs(60)).await;
    shutdown.cancel();
    let report = serving.await.unwrap().unwrap();
    assert_eq!(
        (report.completed, report.handler_errors),
        (60, 6),
        "{report:?}"
    );
    let mut tx = store.pool().begin().await.unwrap();
    let rows: Vec<(String, i64)> = sqlx::query_as(&format!(
        "SELECT run_id, fence FROM \"{}\".payments ORDER BY run_id",
        store.schema()
    ))
    .persistent(false)
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(rows.len(), 60, "one row per run, none of a failed attempt");
    for (run, fence) in rows {
        let record = store.inspect(&id(&run)).await.unwrap();
        assert_eq!(record.state, RunState::Completed, "{run}");
        assert_eq!(
            record.fence.get() as i64,
            fence,
            "{run}: the completion's fence"
        );
        let expected = if run.ends_with('0') { 2 } else { 1 };
        assert_eq!(fence, expected, "{run}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_another_client_leaves_on_the_server_session_do_not_reach_the_store() {
    let Some(upstream) = postgres_url().await else {
        return;
    };
    // One server session for every client: what one leaves on it, the next one gets.
    let Some(bouncer) = required("pgbouncer", PgBouncer::start(&upstream, 1), PGBOUNCER_HINT)
    else {
        return;
    };
    let config = PostgresConfig::from_url(bouncer.url())
        .with_schema(unique_namespace("lease_pgb_leak"))
        .with_lock_wait(Duration::from_millis(300))
        .with_call_timeout(Duration::from_secs(4));
    let store = PostgresLeaseStore::connect(config).await.unwrap();
    let run = id("locked");
    store.create(&run).await.unwrap();

    // A careless client of the same pooler sets session-level what the store relies on.
    let mut careless = sqlx::PgConnection::connect(&bouncer.plain_url())
        .await
        .unwrap();
    sqlx::raw_sql(
        "SET lock_timeout = 0; SET synchronous_commit = off; \
         SET default_transaction_isolation = 'serializable'",
    )
    .execute(&mut careless)
    .await
    .unwrap();
    let left = sqlx::raw_sql("SHOW lock_timeout")
        .fetch_one(&mut careless)
        .await
        .unwrap();
    let left: String = sqlx::Row::get(&left, 0);
    assert_eq!(left, "0", "the setting stays on the one server session");

    // A transaction on a direct connection holds the run's row.
    let mut direct = sqlx::PgConnection::connect(&upstream).await.unwrap();
    let mut holding = direct.begin().await.unwrap();
    sqlx::query(&format!(
        "SELECT 1 FROM \"{}\".runs WHERE run_id = $1 FOR UPDATE",
        store.schema()
    ))
    .bind(run.as_str())
    .execute(&mut *holding)
    .await
    .unwrap();

    // With lock_timeout = 0 the claim would wait until the call timeout (4 s); the store's
    // own transaction-local lock wait (300 ms) ends it, and says why.
    let started = Instant::now();
    let refused = store
        .claim(
            &run,
            &WorkerId::new("w").unwrap(),
            Ttl::from_secs(10).unwrap(),
        )
        .await
        .expect_err("the row is locked");
    let took = started.elapsed();
    assert!(matches!(refused, Error::Unavailable { .. }), "{refused:?}");
    assert!(
        refused.to_string().contains("lock_timeout"),
        "the refusal names the lock wait, not the call timeout: {refused}"
    );
    assert!(took < Duration::from_secs(3), "refused after {took:?}");
    holding.rollback().await.unwrap();

    // The row free again, the claim succeeds at fence 1: the serializable default left by the
    // other client did not turn the store's READ COMMITTED transactions into failures.
    let lease = store
        .claim(
            &run,
            &WorkerId::new("w").unwrap(),
            Ttl::from_secs(10).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(lease.fence().get(), 1);
    store.complete(&lease).await.unwrap();
    assert_eq!(
        store.inspect(&run).await.unwrap().state,
        RunState::Completed
    );
    drop(bouncer);
}

#[tokio::test]
async fn the_pooler_without_pooler_transaction_is_refused_with_the_parameter_to_add() {
    let Some(upstream) = postgres_url().await else {
        return;
    };
    let Some(bouncer) = required("pgbouncer", PgBouncer::start(&upstream, 2), PGBOUNCER_HINT)
    else {
        return;
    };
    let refused = PostgresLeaseStore::connect(
        PostgresConfig::from_url(bouncer.plain_url())
            .with_schema(unique_namespace("lease_pgb_plain"))
            .with_acquire_timeout(Duration::from_secs(5)),
    )
    .await
    .expect_err("PgBouncer refuses the startup options");
    assert!(
        matches!(refused, Error::Misconfigured { .. }),
        "{refused:?}"
    );
    assert!(
        refused.to_string().contains("pooler=transaction"),
        "{refused}"
    );
}

#[tokio::test]
async fn the_durability_check_reads_the_server_through_the_pooler() {
    let Some(upstream) = postgres_url().await else {
        return;
    };
    let Some(bouncer) = required("pgbouncer", PgBouncer::start(&upstream, 2), PGBOUNCER_HINT)
    else {
        return;
    };
    let mut direct = sqlx::PgConnection::connect(&upstream).await.unwrap();
    let fsync: String = sqlx::query_scalar("SHOW fsync")
        .fetch_one(&mut direct)
        .await
        .unwrap();
    // The pooler's URL without the upstream's volatile=true.
    let strict = bouncer
        .url()
        .replace("volatile=true&", "")
        .replace("volatile=true", "");
    let connected = PostgresLeaseStore::connect(
        PostgresConfig::from_url(&strict).with_schema(unique_namespace("lease_pgb_fsync")),
    )
    .await;
    match (fsync.as_str(), connected) {
        ("on", Ok(store)) => assert!(store.accepted_risks().is_empty()),
        ("on", Err(e)) => panic!("a durable server refused through the pooler: {e}"),
        (_, Ok(_)) => panic!("fsync = {fsync} was accepted through the pooler"),
        (_, Err(e)) => {
            assert!(matches!(e, Error::Misconfigured { .. }), "{e:?}");
            assert!(e.to_string().contains("fsync"), "{e}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_behind_the_pooler_listen_on_the_listen_url_and_poll_without_it() {
    let Some(url) = pgbouncer_url().await else {
        return;
    };
    let Some(upstream) = postgres_url().await else {
        return;
    };
    let polling = pooled_store(&url).await;
    assert!(
        !polling.capabilities().wake_ups,
        "without listen_url nobody listens"
    );
    let direct = upstream
        .split_once('@')
        .map(|(_, rest)| rest.split(['/', '?']).next().unwrap_or_default().to_owned())
        .unwrap();
    let listening = Arc::new(
        PostgresLeaseStore::connect(
            PostgresConfig::from_url(&url)
                .with_listen_url(format!("postgres://{direct}"))
                .with_schema(unique_namespace("lease_pgb_wake")),
        )
        .await
        .unwrap(),
    );
    assert!(listening.capabilities().wake_ups);
    // A poll so rare that only a wake-up can start the run in time.
    let config =
        WorkerConfig::new(Ttl::from_secs(30).unwrap()).with_poll_interval(Duration::from_secs(120));
    let worker = Worker::new(listening.clone(), WorkerId::new("w").unwrap(), config).unwrap();
    let shutdown = CancellationToken::new();
    let handler = |_ctx: RunContext| async move { Ok::<_, BoxError>(End::Complete) };
    let serving = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { worker.run(handler, shutdown).await }
    });
    // Let the worker make its first (empty) poll and start listening.
    tokio::time::sleep(Duration::from_millis(500)).await;
    listening.create(&id("woken")).await.unwrap();
    until_completed(&*listening, 1, Duration::from_secs(20)).await;
    shutdown.cancel();
    assert_eq!(serving.await.unwrap().unwrap().completed, 1);
}
