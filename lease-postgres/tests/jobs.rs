//! The job layer in the caller's transaction: runs enqueued with a start delay by
//! `create_with_in` / `create_many_with_in` exist only if the transaction commits, and wait
//! their delay on the database clock; a cancel and an `end_in` that commits the holder's
//! effect in the caller's transaction are ordered by the run's row lock, so exactly one of
//! them wins, and the caller's table holds the effect only if the run completed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_conformance::fixtures::{postgres_url, unique_namespace};
use lease_core::{End, Ended, Error, LeaseStore, NewRun, RunId, RunState, Ttl, WorkerId};
use lease_postgres::{sqlx, PostgresConfig, PostgresLeaseStore};

/// How the holder's transaction ended.
#[derive(Debug)]
enum Holder {
    /// `fence_in`, the effect, `end_in` and the commit all succeeded.
    Committed,
    /// The store refused the lease inside the transaction, which was rolled back.
    Refused(Error),
}

/// The holder's transaction: fence, effect, end, commit; retried from the start while the
/// store answers a retryable error, as a worker would.
async fn pay(store: &PostgresLeaseStore, table: &str, lease: &lease_core::Lease) -> Holder {
    let started = Instant::now();
    loop {
        let mut tx = store.pool().begin().await.unwrap();
        let attempt = async {
            store.fence_in(&mut tx, lease).await?;
            sqlx::query(&format!("INSERT INTO {table} VALUES ($1, $2)"))
                .bind(lease.run().as_str())
                .bind(lease.fence().get() as i64)
                .execute(&mut *tx)
                .await
                .map_err(|e| Error::backend("test", e.to_string()))?;
            store.end_in(&mut tx, lease, End::Complete).await
        }
        .await;
        match attempt {
            Ok(()) => {
                tx.commit().await.unwrap();
                return Holder::Committed;
            }
            Err(e) => {
                tx.rollback().await.unwrap();
                if e.is_retryable() && started.elapsed() < Duration::from_secs(10) {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                return Holder::Refused(e);
            }
        }
    }
}

/// 1,000 races, 20 at a time, of a cancel against the holder's transaction. Every race has
/// exactly one winner: the effect row and a completed run with the cancel refused as
/// completed, or no row and a cancelled run with the holder refused as cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_racing_end_in_lets_exactly_one_commit() {
    let Some(url) = postgres_url().await else {
        return;
    };
    let store = Arc::new(
        PostgresLeaseStore::connect(
            PostgresConfig::from_url(url).with_schema(unique_namespace("cancel")),
        )
        .await
        .unwrap(),
    );
    let table = format!("\"{}\".payments", store.schema());
    sqlx::query(&format!(
        "CREATE TABLE {table} (run_id TEXT PRIMARY KEY, fence BIGINT NOT NULL)"
    ))
    .execute(store.pool())
    .await
    .unwrap();
    let worker = WorkerId::new("w").unwrap();
    let ttl = Ttl::from_secs(60).unwrap();
    let (mut completed, mut cancelled) = (0, 0);
    for round in 0..50 {
        let mut races = Vec::new();
        for i in 0..20 {
            let run = RunId::new(format!("pay-{round}-{i}")).unwrap();
            store.create(&run).await.unwrap();
            let lease = store.claim(&run, &worker, ttl).await.unwrap();
            let (s1, s2, t) = (store.clone(), store.clone(), table.clone());
            let r = run.clone();
            races.push(tokio::spawn(async move {
                let holder = tokio::spawn(async move { pay(&s1, &t, &lease).await });
                let cancel = tokio::spawn(async move { s2.cancel(&r, "customer asked").await });
                (run, holder.await.unwrap(), cancel.await.unwrap())
            }));
        }
        for race in races {
            let (run, holder, cancel) = race.await.unwrap();
            let state = store.inspect(&run).await.unwrap().state;
            let rows: i64 =
                sqlx::query_scalar(&format!("SELECT count(*) FROM {table} WHERE run_id = $1"))
                    .bind(run.as_str())
                    .fetch_one(store.pool())
                    .await
                    .unwrap();
            match (&holder, &cancel) {
                (Holder::Committed, Err(Error::Completed { .. })) => {
                    assert_eq!((state, rows), (RunState::Completed, 1), "{run}");
                    completed += 1;
                }
                (
                    Holder::Refused(Error::LeaseEnded {
                        ended: Ended::Cancelled,
                        fence: 1,
                        ..
                    }),
                    Ok(record),
                ) => {
                    assert_eq!(record.state, RunState::Cancelled);
                    assert_eq!((state, rows), (RunState::Cancelled, 0), "{run}");
                    cancelled += 1;
                }
                other => panic!("{run}: not exactly one winner: {other:?}"),
            }
        }
    }
    eprintln!("end_in against cancel: {completed} committed first, {cancelled} cancelled first");
    assert_eq!(completed + cancelled, 1_000);
}

/// A delayed run with a payload enqueued in the caller's transaction: gone with a rollback,
/// payload and all; after the commit, runnable with the committed payload, not claimable before
/// its delay (`Delayed`, and `claim_next` passes it by), while the undelayed run of the same
/// batch is handed out at once with its own payload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_scheduled_in_a_transaction_exist_only_if_it_commits_and_wait_their_delay() {
    let Some(url) = postgres_url().await else {
        return;
    };
    let schema = unique_namespace("schedule_in_tx");
    let store = PostgresLeaseStore::connect(PostgresConfig::from_url(url).with_schema(&schema))
        .await
        .unwrap();
    let payload_rows = || async {
        sqlx::query_scalar::<_, i64>(&format!("SELECT count(*) FROM {schema}.run_payloads"))
            .fetch_one(store.pool())
            .await
            .unwrap()
    };
    let later = RunId::new("invoice-later").unwrap();
    let now = RunId::new("invoice-now").unwrap();
    let hour = Duration::from_secs(3600);

    let mut tx = store.pool().begin().await.unwrap();
    let record = store
        .create_with_in(
            &mut tx,
            &NewRun::new(later.clone())
                .with_delay(hour)
                .with_payload(b"rolled back".to_vec()),
        )
        .await
        .unwrap();
    assert!(record.not_before.is_some(), "{record:?}");
    assert_eq!(record.payload.as_deref(), Some(&b"rolled back"[..]));
    tx.rollback().await.unwrap();
    assert!(matches!(
        store.inspect(&later).await,
        Err(Error::NotFound { .. })
    ));
    assert_eq!(
        payload_rows().await,
        0,
        "the payload went with the rollback"
    );

    let mut tx = store.pool().begin().await.unwrap();
    let created = store
        .create_many_with_in(
            &mut tx,
            &[
                NewRun::new(later.clone())
                    .with_delay(hour)
                    .with_payload(b"kept".to_vec()),
                NewRun::new(now.clone()).with_payload(b"now".to_vec()),
            ],
        )
        .await
        .unwrap();
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    tx.commit().await.unwrap();
    assert_eq!(payload_rows().await, 2);

    let record = store.inspect(&later).await.unwrap();
    assert_eq!(record.payload.as_deref(), Some(&b"kept"[..]));
    let left = record
        .not_before
        .expect("a delayed run says when it is claimable")
        .saturating_since(record.observed_at);
    assert!(
        left > hour - Duration::from_secs(60) && left <= hour,
        "claimable in {left:?}"
    );
    let worker = WorkerId::new("w").unwrap();
    let ttl = Ttl::from_secs(60).unwrap();
    assert!(matches!(
        store.claim(&later, &worker, ttl).await,
        Err(Error::Delayed { .. })
    ));
    let handed = store.claim_next(&worker, ttl, 10).await.unwrap();
    assert_eq!(
        handed.iter().map(|l| l.run().clone()).collect::<Vec<_>>(),
        [now]
    );
    assert_eq!(handed[0].payload(), Some(&b"now"[..]));
}

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct SendReceipt {
    order: u64,
}
impl lease_runtime::JobArgs for SendReceipt {
    const KIND: &'static str = "send_receipt";
}

/// Typed inserts in the caller's transaction: a rolled-back insert leaves nothing; an insert
/// with an id that exists answers `duplicate` without aborting the transaction, which goes on
/// and commits; a worker serving the kind gets the committed job's arguments once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_inserts_commit_with_the_callers_transaction_and_a_resend_is_a_duplicate() {
    use lease_runtime::{
        CancellationToken, InsertExt, InsertOpts, Kinds, RunContext, Worker, WorkerConfig,
    };
    let Some(url) = postgres_url().await else {
        return;
    };
    let schema = unique_namespace("typed_in_tx");
    let store = PostgresLeaseStore::connect(PostgresConfig::from_url(url).with_schema(&schema))
        .await
        .unwrap();
    let orders = format!("\"{schema}\".orders");
    sqlx::query(&format!("CREATE TABLE {orders} (id BIGINT PRIMARY KEY)"))
        .execute(store.pool())
        .await
        .unwrap();

    let mut tx = store.pool().begin().await.unwrap();
    let dropped = store
        .insert_tx(&mut tx, &SendReceipt { order: 1 }, InsertOpts::new())
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert!(matches!(
        store.inspect(&dropped.run_id).await,
        Err(Error::NotFound { .. })
    ));

    let named = InsertOpts::new().with_id(RunId::new("receipt-7").unwrap());
    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query(&format!("INSERT INTO {orders} VALUES (7)"))
        .execute(&mut *tx)
        .await
        .unwrap();
    let first = store
        .insert_tx(&mut tx, &SendReceipt { order: 7 }, named.clone())
        .await
        .unwrap();
    let resent = store
        .insert_many_tx(&mut tx, &[(SendReceipt { order: 7 }, named.clone())])
        .await
        .unwrap();
    assert!(!first.duplicate);
    assert!(resent[0].duplicate, "{resent:?}");
    assert_eq!(resent[0].run_id, first.run_id);
    // A unique key in the same transaction: the second insert finds the first's run.
    let keyed = InsertOpts::new().with_unique_key("receipt:8");
    let by_key = store
        .insert_tx(&mut tx, &SendReceipt { order: 8 }, keyed.clone())
        .await
        .unwrap();
    let by_key_again = store
        .insert_tx(&mut tx, &SendReceipt { order: 8 }, keyed)
        .await
        .unwrap();
    assert!(!by_key.duplicate && by_key_again.duplicate);
    assert_eq!(by_key_again.run_id, by_key.run_id);
    // A queue, and a batch into another, in the same transaction.
    let queued = store
        .insert_tx(
            &mut tx,
            &SendReceipt { order: 9 },
            InsertOpts::new().with_queue("receipts"),
        )
        .await
        .unwrap();
    let batched = store
        .insert_many_tx(
            &mut tx,
            &[(
                SendReceipt { order: 10 },
                InsertOpts::new().with_queue("bulk"),
            )],
        )
        .await
        .unwrap();
    // The duplicate did not abort the transaction: it still writes and commits.
    sqlx::query(&format!("INSERT INTO {orders} VALUES (8)"))
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    for (inserted, queue) in [(&queued, "receipts"), (&batched[0], "bulk")] {
        let record = store.inspect(&inserted.run_id).await.unwrap();
        assert_eq!(record.queue.as_str(), queue, "{record:?}");
    }
    // Outside a transaction, through the store-wide extension: a duplicate too.
    let again = store
        .insert(&SendReceipt { order: 7 }, named)
        .await
        .unwrap();
    assert!(again.duplicate);

    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let handled = seen.clone();
    let kinds = Kinds::new().job::<SendReceipt, _, _>(move |ctx: RunContext, args: SendReceipt| {
        let seen = handled.clone();
        async move {
            seen.lock()
                .unwrap()
                .push((ctx.run().to_string(), args.order));
            Ok(End::Complete)
        }
    });
    let shared: Arc<dyn LeaseStore> = Arc::new(store.clone());
    let config = WorkerConfig::new(Ttl::from_secs(30).unwrap())
        .with_poll_interval(Duration::from_millis(20));
    let worker = Worker::new(shared, WorkerId::new("w").unwrap(), config).unwrap();
    let stop = CancellationToken::new();
    let token = stop.clone();
    let serving = tokio::spawn(async move { worker.run_kinds(kinds, token).await });
    let give_up = Instant::now() + Duration::from_secs(20);
    for run in [&first.run_id, &by_key.run_id] {
        while store.inspect(run).await.unwrap().state != RunState::Completed {
            assert!(Instant::now() < give_up, "{run} was not completed in 20 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    stop.cancel();
    serving.await.unwrap().unwrap();
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    let mut expected = vec![("receipt-7".to_owned(), 7), (by_key.run_id.to_string(), 8)];
    expected.sort();
    assert_eq!(seen, expected, "each job's handler got its arguments once");
}
