//! Group-committed effects (`PgEffect`, `end_many_with_effects`): each effect commits with its
//! end or not at all, under its lease's fence, in a savepoint of its own; and the Worker's use
//! of them (a failed effect is a failed attempt, retried while its neighbours commit).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lease_conformance::fixtures::{postgres_url, unique_namespace};
use lease_core::{
    BoxError, Effect, End, Ended, Ending, Error, InvalidInput, Lease, LeaseStore, RunId, RunState,
    Ttl, WorkerId,
};
use lease_postgres::{sqlx, Bind, PgEffect, PostgresConfig, PostgresLeaseStore};
use lease_runtime::{
    CancellationToken, FaultyStore, MemoryLeaseStore, ReplyFault, RetryPolicy, RunContext, Worker,
    WorkerConfig,
};

async fn store() -> Option<PostgresLeaseStore> {
    let url = postgres_url().await?;
    let config = PostgresConfig::from_url(url).with_schema(unique_namespace("lease_effects"));
    let store = PostgresLeaseStore::connect(config).await.expect("connect");
    sqlx::query(&format!(
        "CREATE TABLE \"{}\".payments (run_id TEXT PRIMARY KEY, fence BIGINT NOT NULL)",
        store.schema()
    ))
    .execute(store.pool())
    .await
    .expect("payments table");
    Some(store)
}

fn id(s: &str) -> RunId {
    RunId::new(s).unwrap()
}

/// An effect that inserts `(run, fence)` into `payments` and counts its runs in `calls`.
fn insert(store: &PostgresLeaseStore, lease: &Lease, calls: &Arc<AtomicUsize>) -> Effect {
    insert_then(store, lease, calls, || {})
}

/// [`insert`], calling `hook` each time the effect runs.
fn insert_then(
    store: &PostgresLeaseStore,
    lease: &Lease,
    calls: &Arc<AtomicUsize>,
    hook: impl Fn() + Send + Sync + 'static,
) -> Effect {
    let sql = format!(
        "INSERT INTO \"{}\".payments (run_id, fence) VALUES ($1, $2)",
        store.schema()
    );
    let (run, fence, calls) = (
        lease.run().to_string(),
        lease.fence().get() as i64,
        calls.clone(),
    );
    PgEffect::new(move |conn| {
        calls.fetch_add(1, Ordering::SeqCst);
        hook();
        let (sql, run) = (sql.clone(), run.clone());
        Box::pin(async move {
            sqlx::query(&sql)
                .bind(run)
                .bind(fence)
                .execute(&mut *conn)
                .await?;
            Ok(())
        })
    })
    .into()
}

/// The payment rows: (run, fence), by run.
async fn payments(store: &PostgresLeaseStore) -> Vec<(String, i64)> {
    sqlx::query_as(&format!(
        "SELECT run_id, fence FROM \"{}\".payments ORDER BY run_id",
        store.schema()
    ))
    .fetch_all(store.pool())
    .await
    .expect("payments")
}

async fn claimed(store: &PostgresLeaseStore, run: &str) -> Lease {
    store.create(&id(run)).await.expect("create");
    store
        .claim(
            &id(run),
            &WorkerId::new("w").unwrap(),
            Ttl::from_secs(30).unwrap(),
        )
        .await
        .expect("claim")
}

#[tokio::test]
async fn a_failing_effect_rolls_back_alone_and_its_lease_stays_held() {
    let Some(store) = store().await else { return };
    let calls = Arc::new(AtomicUsize::new(0));
    let (a, b, c, d, e) = (
        claimed(&store, "a").await,
        claimed(&store, "b").await,
        claimed(&store, "c").await,
        claimed(&store, "d").await,
        claimed(&store, "e").await,
    );
    // c's insert meets a row already there: a statement error, which aborts the transaction
    // unless the savepoint rescues it.
    sqlx::query(&format!(
        "INSERT INTO \"{}\".payments VALUES ('c', 999)",
        store.schema()
    ))
    .execute(store.pool())
    .await
    .unwrap();
    // d's effect writes, then its handler's code refuses: its write must go too.
    let d_sql = format!(
        "INSERT INTO \"{}\".payments VALUES ('d', 1)",
        store.schema()
    );
    let d_effect: Effect = PgEffect::new(move |conn| {
        let sql = d_sql.clone();
        Box::pin(async move {
            sqlx::query(&sql).execute(&mut *conn).await?;
            Err::<(), BoxError>("the charge was declined".into())
        })
    })
    .into();
    let ends: Vec<Ending> = [&a, &b, &c, &d, &e]
        .iter()
        .map(|l| Ending::new((*l).clone(), End::Complete))
        .collect();
    let effects = vec![
        Some(insert(&store, &a, &calls)),
        None,
        Some(insert(&store, &c, &calls)),
        Some(d_effect),
        // After two failures, an effect that succeeds: only the failed ones are undone.
        Some(insert(&store, &e, &calls)),
    ];
    let results = store
        .end_many_with_effects(&ends, &effects)
        .await
        .expect("the batch is decided");
    assert!(results[0].is_ok(), "{:?}", results[0]);
    assert!(results[1].is_ok(), "{:?}", results[1]);
    assert!(results[4].is_ok(), "{:?}", results[4]);
    match &results[2] {
        Err(Error::EffectFailed { run, reason }) => {
            assert_eq!(run.as_str(), "c");
            assert!(reason.contains("duplicate key"), "{reason}");
        }
        other => panic!("c: {other:?}"),
    }
    match &results[3] {
        Err(Error::EffectFailed { run, reason }) => {
            assert_eq!(run.as_str(), "d");
            assert!(reason.contains("declined"), "{reason}");
        }
        other => panic!("d: {other:?}"),
    }
    assert_eq!(
        payments(&store).await,
        [
            ("a".to_owned(), 1),
            ("c".to_owned(), 999),
            ("e".to_owned(), 1)
        ],
        "a's and e's effects committed, c's and d's rolled back to their savepoints"
    );
    for (run, state) in [
        ("a", RunState::Completed),
        ("b", RunState::Completed),
        ("e", RunState::Completed),
    ] {
        assert_eq!(store.inspect(&id(run)).await.unwrap().state, state, "{run}");
    }
    for lease in [&c, &d] {
        let record = store.inspect(lease.run()).await.unwrap();
        assert_eq!(
            (record.state, record.owner.is_some(), record.fence),
            (RunState::Runnable, true, lease.fence()),
            "{}: nothing written, still held",
            lease.run()
        );
    }
    // Still held: the holder ends it another way.
    store.release(&c).await.expect("c's lease is still held");
}

#[tokio::test]
async fn a_lost_lease_never_runs_its_effect_and_a_retry_runs_none_again() {
    let Some(store) = store().await else { return };
    let calls = Arc::new(AtomicUsize::new(0));
    // x: released and claimed again, so its first lease is stale.
    let stale = claimed(&store, "x").await;
    store.release(&stale).await.unwrap();
    store
        .claim(
            &id("x"),
            &WorkerId::new("v").unwrap(),
            Ttl::from_secs(30).unwrap(),
        )
        .await
        .unwrap();
    let y = claimed(&store, "y").await;
    let ends = vec![
        Ending::new(stale.clone(), End::Complete),
        Ending::new(y.clone(), End::Complete),
    ];
    let effects = vec![
        Some(insert(&store, &stale, &calls)),
        Some(insert(&store, &y, &calls)),
    ];
    let first = store.end_many_with_effects(&ends, &effects).await.unwrap();
    assert!(
        matches!(
            &first[0],
            Err(Error::StaleFence {
                presented: 1,
                current: 2,
                ..
            })
        ),
        "{:?}",
        first[0]
    );
    assert!(first[1].is_ok(), "{:?}", first[1]);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "only y's effect ran");

    // The same call again, as after a commit that got no answer: y is recognised as ended
    // under its own fence, and its effect does not run again.
    let again = store.end_many_with_effects(&ends, &effects).await.unwrap();
    assert!(
        matches!(
            &again[1],
            Err(Error::LeaseEnded {
                fence: 1,
                ended: Ended::Completed,
                ..
            })
        ),
        "{:?}",
        again[1]
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "no effect ran on the retry"
    );
    // A run that does not exist: its effect never runs either.
    let gone = Lease::new(
        id("gone"),
        WorkerId::new("w").unwrap(),
        lease_core::Fence::new(1).unwrap(),
        Ttl::from_secs(30).unwrap(),
        lease_core::StoreTime::from_micros(0),
    )
    .unwrap();
    let missing = store
        .end_many_with_effects(
            &[Ending::new(gone.clone(), End::Complete)],
            &[Some(insert(&store, &gone, &calls))],
        )
        .await
        .unwrap();
    assert!(
        matches!(&missing[0], Err(Error::NotFound { .. })),
        "{missing:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(payments(&store).await, [("y".to_owned(), 1)]);
}

#[tokio::test]
async fn effects_of_another_kind_or_count_are_refused_before_any_io() {
    let Some(store) = store().await else { return };
    let lease = claimed(&store, "r").await;
    let ends = vec![Ending::new(lease.clone(), End::Complete)];
    let foreign = Effect::new(42_u32);
    assert!(!store.takes_effect(&foreign));
    let refused = store
        .end_many_with_effects(&ends, &[Some(foreign)])
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, Error::InvalidInput(InvalidInput::Effects { why }) if why.contains("another backend")),
        "{refused:?}"
    );
    let refused = store.end_many_with_effects(&ends, &[]).await.unwrap_err();
    assert!(
        matches!(&refused, Error::InvalidInput(InvalidInput::Effects { why }) if why.contains("as many")),
        "{refused:?}"
    );
    let record = store.inspect(lease.run()).await.unwrap();
    assert_eq!(
        (record.state, record.owner.is_some()),
        (RunState::Runnable, true)
    );
    // No effect at all: an end_many.
    let plain = store.end_many_with_effects(&ends, &[None]).await.unwrap();
    assert!(plain[0].is_ok());
}

#[tokio::test]
async fn a_batch_over_64_effects_commits_every_one() {
    let Some(store) = store().await else { return };
    let calls = Arc::new(AtomicUsize::new(0));
    let runs: Vec<RunId> = (0..150).map(|i| id(&format!("big-{i:03}"))).collect();
    store.create_many(&runs).await.unwrap();
    let leases = store
        .claim_next(
            &WorkerId::new("w").unwrap(),
            Ttl::from_secs(30).unwrap(),
            150,
        )
        .await
        .unwrap();
    assert_eq!(leases.len(), 150);
    let ends: Vec<Ending> = leases
        .iter()
        .map(|l| Ending::new(l.clone(), End::Complete))
        .collect();
    let effects: Vec<Option<Effect>> = leases
        .iter()
        .map(|l| Some(insert(&store, l, &calls)))
        .collect();
    let results = store.end_many_with_effects(&ends, &effects).await.unwrap();
    assert_eq!(results.len(), 150);
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(payments(&store).await.len(), 150);
    assert_eq!(calls.load(Ordering::SeqCst), 150);
    assert_eq!(store.count().await.unwrap().completed, 150);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_commits_effects_with_its_ends_and_retries_a_failed_one() {
    let Some(store) = store().await else { return };
    let store = Arc::new(store);
    let runs: Vec<RunId> = (0..40).map(|i| id(&format!("job-{i:02}"))).collect();
    store.create_many(&runs).await.unwrap();
    let sql = format!(
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
    let worker = Worker::new(store.clone(), WorkerId::new("w").unwrap(), config).unwrap();
    let shutdown = CancellationToken::new();
    let handler = move |ctx: RunContext| {
        let sql = sql.clone();
        async move {
            let run = ctx.run().to_string();
            let fence = ctx.fence().get() as i64;
            // Every fifth run's effect fails on its first attempt.
            let fail = ctx.attempt() == 1 && (run.ends_with('0') || run.ends_with('5'));
            ctx.set_effect(PgEffect::new(move |conn| {
                let (sql, run) = (sql.clone(), run.clone());
                Box::pin(async move {
                    sqlx::query(&sql)
                        .bind(run)
                        .bind(fence)
                        .execute(&mut *conn)
                        .await?;
                    if fail {
                        return Err("first attempt fails after its write".into());
                    }
                    Ok(())
                })
            }))?;
            Ok::<_, BoxError>(End::Complete)
        }
    };
    let run = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { worker.run(handler, shutdown).await }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while store.count().await.unwrap().completed < 40 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not every run completed in 30 s: {:?}",
            store.count().await.unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    let report = run.await.unwrap().unwrap();
    assert_eq!(report.completed, 40, "{report:?}");
    assert_eq!(
        report.handler_errors, 8,
        "one failed effect per fifth run: {report:?}"
    );
    assert_eq!(report.refused + report.failed, 0, "{report:?}");
    let rows = payments(&store).await;
    assert_eq!(
        rows.len(),
        40,
        "one row per run, none from a failed attempt"
    );
    for (run, fence) in rows {
        let record = store.inspect(&id(&run)).await.unwrap();
        assert_eq!(record.state, RunState::Completed);
        assert_eq!(
            record.fence.get() as i64,
            fence,
            "{run}: the row is its completion's"
        );
        let again = run.ends_with('0') || run.ends_with('5');
        assert_eq!(record.fence.get(), if again { 2 } else { 1 }, "{run}");
    }
}

#[tokio::test]
async fn a_store_without_effects_fails_the_attempt_that_sets_one() {
    let store = Arc::new(MemoryLeaseStore::new());
    store.create(&id("m")).await.unwrap();
    let config = WorkerConfig::new(Ttl::from_secs(30).unwrap())
        .with_retry(RetryPolicy::default().with_max_attempts(1));
    let worker = Worker::new(store.clone(), WorkerId::new("w").unwrap(), config).unwrap();
    let shutdown = CancellationToken::new();
    let handler = |ctx: RunContext| async move {
        ctx.set_effect(PgEffect::new(|_conn| Box::pin(async { Ok(()) })))?;
        Ok::<_, BoxError>(End::Complete)
    };
    let run = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { worker.run(handler, shutdown).await }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let record = loop {
        let record = store.inspect(&id("m")).await.unwrap();
        if record.state == RunState::Failed {
            break record;
        }
        assert!(tokio::time::Instant::now() < deadline, "{record:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    shutdown.cancel();
    let report = run.await.unwrap().unwrap();
    assert_eq!((report.completed, report.handler_errors), (0, 1));
    let why = record.failure.unwrap_or_default();
    assert!(why.contains("cannot apply this effect"), "{why}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_applied_but_unanswered_is_recognised_and_its_effect_runs_once() {
    let Some(store) = store().await else { return };
    let store = Arc::new(store);
    let faulty = Arc::new(FaultyStore::new(store.clone()));
    store.create(&id("once")).await.unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let config = WorkerConfig::new(Ttl::from_secs(30).unwrap()).with_concurrency(1);
    let worker = Worker::new(faulty.clone(), WorkerId::new("w").unwrap(), config).unwrap();
    let shutdown = CancellationToken::new();
    let handler = {
        let (store, faulty, calls) = (store.clone(), faulty.clone(), calls.clone());
        move |ctx: RunContext| {
            let (store, faulty, calls) = (store.clone(), faulty.clone(), calls.clone());
            async move {
                let switch = faulty.clone();
                // The call running the effect lost its reply already (chosen before it ran);
                // the next one, the batcher's retry, gets its answer.
                let effect = insert_then(&store, &ctx.lease(), &calls, move || {
                    switch.set_reply(ReplyFault::Pass)
                });
                ctx.set_effect(effect)?;
                // The batch that carries this end is applied, and its caller told Unavailable.
                faulty.set_reply(ReplyFault::Error);
                Ok::<_, BoxError>(End::Complete)
            }
        }
    };
    let run = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { worker.run(handler, shutdown).await }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while store.inspect(&id("once")).await.unwrap().state != RunState::Completed {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not completed in 20 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Let the worker count the end, then stop it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    shutdown.cancel();
    let report = run.await.unwrap().unwrap();
    assert_eq!(
        (report.completed, report.refused, report.failed),
        (1, 0, 0),
        "the retry's LeaseEnded under the same fence is the first call's commit: {report:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the effect ran once");
    assert_eq!(payments(&store).await, [("once".to_owned(), 1)]);
}

#[tokio::test]
async fn a_statement_effect_binds_each_kind_of_parameter() {
    let Some(store) = store().await else { return };
    let schema = store.schema().to_owned();
    sqlx::query(&format!(
        "CREATE TABLE \"{schema}\".typed (t TEXT, i BIGINT, f DOUBLE PRECISION, b BOOLEAN, \
         y BYTEA, n TEXT)"
    ))
    .execute(store.pool())
    .await
    .unwrap();
    let lease = claimed(&store, "typed").await;
    let effect: Effect = PgEffect::statement(
        format!("INSERT INTO \"{schema}\".typed VALUES ($1, $2, $3, $4, $5, $6)"),
        [
            "text".into(),
            (-7_i64).into(),
            2.5_f64.into(),
            true.into(),
            vec![0_u8, 255].into(),
            Bind::NullText,
        ],
    )
    .into();
    let results = store
        .end_many_with_effects(&[Ending::new(lease, End::Complete)], &[Some(effect)])
        .await
        .unwrap();
    assert!(results[0].is_ok(), "{results:?}");
    let row: (String, i64, f64, bool, Vec<u8>, Option<String>) =
        sqlx::query_as(&format!("SELECT t, i, f, b, y, n FROM \"{schema}\".typed"))
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(row, ("text".to_owned(), -7, 2.5, true, vec![0, 255], None));
}
