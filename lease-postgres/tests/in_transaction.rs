//! The store's part inside a transaction, with the caller's own statements: a fenced
//! transaction that ends the lease, the caller's own transaction with `fence_in` / `end_in`,
//! and transactional enqueue (`create_in`, `create_many_in`). Every refusal rolls the caller's
//! statements back with it.

use std::time::Duration;

use lease_conformance::fixtures::{postgres_url, unique_namespace};
use lease_core::{End, Ended, Error, LeaseStore, RunId, RunState, Ttl, WorkerId};
use lease_postgres::{sqlx, PostgresConfig, PostgresLeaseStore};

fn id(s: &str) -> RunId {
    RunId::new(s).unwrap()
}

fn worker(s: &str) -> WorkerId {
    WorkerId::new(s).unwrap()
}

fn ttl(ms: u64) -> Ttl {
    Ttl::from_millis(ms).unwrap()
}

/// A store in a fresh schema, and the caller's own table there: `payments(run_id, fence)`.
async fn store_and_payments() -> Option<(PostgresLeaseStore, String)> {
    let url = postgres_url().await?;
    let store = PostgresLeaseStore::connect(
        PostgresConfig::from_url(url).with_schema(unique_namespace("in_tx")),
    )
    .await
    .unwrap();
    let table = format!("\"{}\".payments", store.schema());
    sqlx::query(&format!(
        "CREATE TABLE {table} (run_id TEXT PRIMARY KEY, fence BIGINT NOT NULL)"
    ))
    .execute(store.pool())
    .await
    .unwrap();
    Some((store, table))
}

async fn payments(store: &PostgresLeaseStore, table: &str) -> Vec<(String, i64)> {
    sqlx::query_as(&format!(
        "SELECT run_id, fence FROM {table} ORDER BY run_id"
    ))
    .fetch_all(store.pool())
    .await
    .unwrap()
}

/// A fenced transaction that ends its lease commits the caller's row and the completion as
/// one: afterwards the run is completed at that fence and the row is there; a `complete_with`
/// journals its effect too; an end the store refuses (an effect over the limit) rolls
/// everything back, the caller's row included, and leaves the lease held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_transaction_ends_its_lease_in_the_same_commit() {
    let Some((store, table)) = store_and_payments().await else {
        return;
    };
    let insert = format!("INSERT INTO {table} VALUES ($1, $2)");
    for (name, end) in [
        ("complete", End::Complete),
        ("complete-with", End::CompleteWith(b"receipt".to_vec())),
        ("suspend", End::Suspend),
        ("release", End::Release),
    ] {
        let run = id(name);
        store.create(&run).await.unwrap();
        let lease = store.claim(&run, &worker("a"), ttl(60_000)).await.unwrap();
        let mut tx = store.fenced_transaction(&lease).await.unwrap();
        sqlx::query(&insert)
            .bind(name)
            .bind(lease.fence().get() as i64)
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.end(end.clone()).await.unwrap();
        let record = store.inspect(&run).await.unwrap();
        assert_eq!(
            (record.state, record.owner, record.fence),
            (end.state(), None, lease.fence()),
            "{name}"
        );
        let journal = store.journal(&run).await.unwrap();
        assert_eq!(
            journal.len(),
            usize::from(name == "complete-with"),
            "{name}"
        );
    }
    assert_eq!(payments(&store, &table).await.len(), 4);

    let run = id("refused");
    store.create(&run).await.unwrap();
    let lease = store.claim(&run, &worker("a"), ttl(60_000)).await.unwrap();
    let mut tx = store.fenced_transaction(&lease).await.unwrap();
    sqlx::query(&insert)
        .bind("refused")
        .bind(1_i64)
        .execute(&mut *tx)
        .await
        .unwrap();
    let err = tx
        .end(End::CompleteWith(vec![
            0;
            lease_core::MAX_PAYLOAD_BYTES + 1
        ]))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err:?}");
    let record = store.inspect(&run).await.unwrap();
    assert_eq!(record.state, RunState::Runnable);
    assert!(record.owner.is_some(), "the lease is still held");
    assert!(
        !payments(&store, &table)
            .await
            .iter()
            .any(|(r, _)| r == "refused"),
        "the caller's row was rolled back with the refused end"
    );
}

/// In the caller's own transaction: `fence_in` refuses a stale fence, an ended lease, a
/// suspended run and a missing run, each with its verdict, and `end_in` refuses an end under a
/// lease ended earlier in the same transaction; after each refusal the caller rolls back and
/// its row is gone. With a current lease, the row and the end commit together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_callers_transaction_commits_its_effect_with_the_end_or_not_at_all() {
    let Some((store, table)) = store_and_payments().await else {
        return;
    };
    let insert = format!("INSERT INTO {table} VALUES ($1, $2)");
    let pool = store.pool().clone();

    // Stale: a was reclaimed by b.
    let stale = id("stale");
    store.create(&stale).await.unwrap();
    let a = store.claim(&stale, &worker("a"), ttl(1)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let b = store
        .claim(&stale, &worker("b"), ttl(60_000))
        .await
        .unwrap();
    // Ended: completed already.
    let done = id("done");
    store.create(&done).await.unwrap();
    let d = store.claim(&done, &worker("a"), ttl(60_000)).await.unwrap();
    store.complete(&d).await.unwrap();
    // Suspended.
    let parked = id("parked");
    store.create(&parked).await.unwrap();
    let p = store
        .claim(&parked, &worker("a"), ttl(60_000))
        .await
        .unwrap();
    store.suspend(&p).await.unwrap();
    // Missing: a lease of a run that never existed, borrowed from another store's schema.
    let other = PostgresLeaseStore::connect(
        PostgresConfig::from_url(postgres_url().await.unwrap())
            .with_schema(unique_namespace("in_tx_other")),
    )
    .await
    .unwrap();
    let ghost = id("ghost");
    other.create(&ghost).await.unwrap();
    let g = other
        .claim(&ghost, &worker("a"), ttl(60_000))
        .await
        .unwrap();

    for (lease, what) in [
        (&a, "stale"),
        (&d, "ended"),
        (&p, "suspended"),
        (&g, "missing"),
    ] {
        let mut tx = pool.begin().await.unwrap();
        sqlx::query(&insert)
            .bind(format!("{what}-effect"))
            .bind(1_i64)
            .execute(&mut *tx)
            .await
            .unwrap();
        let err = store.fence_in(&mut tx, lease).await.unwrap_err();
        let expected = match what {
            "stale" => matches!(
                err,
                Error::StaleFence {
                    presented: 1,
                    current: 2,
                    ..
                }
            ),
            "ended" => matches!(
                err,
                Error::LeaseEnded {
                    ended: Ended::Completed,
                    ..
                }
            ),
            "suspended" => matches!(
                err,
                Error::LeaseEnded {
                    ended: Ended::Suspended,
                    ..
                }
            ),
            _ => matches!(err, Error::NotFound { .. }),
        };
        assert!(expected, "{what}: {err:?}");
        tx.rollback().await.unwrap();
    }
    assert!(
        payments(&store, &table).await.is_empty(),
        "every refused transaction was rolled back"
    );

    // end_in refuses what this very transaction already ended; the caller rolls back.
    let mut tx = pool.begin().await.unwrap();
    store.fence_in(&mut tx, &b).await.unwrap();
    sqlx::query(&insert)
        .bind("twice")
        .bind(2_i64)
        .execute(&mut *tx)
        .await
        .unwrap();
    store.end_in(&mut tx, &b, End::Complete).await.unwrap();
    let err = store.end_in(&mut tx, &b, End::Release).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::LeaseEnded {
                ended: Ended::Completed,
                ..
            }
        ),
        "{err:?}"
    );
    tx.rollback().await.unwrap();
    assert_eq!(
        store.inspect(&stale).await.unwrap().state,
        RunState::Runnable
    );
    assert!(payments(&store, &table).await.is_empty());
    // End::Committed is no store end.
    let mut tx = pool.begin().await.unwrap();
    let err = store
        .end_in(&mut tx, &b, End::Committed(Ended::Completed))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err:?}");
    tx.rollback().await.unwrap();

    // The current lease: effect and end commit together.
    let mut tx = pool.begin().await.unwrap();
    let bound = store.fence_in(&mut tx, &b).await.unwrap();
    assert!(bound >= Duration::from_millis(250), "{bound:?}");
    sqlx::query(&insert)
        .bind("stale")
        .bind(b.fence().get() as i64)
        .execute(&mut *tx)
        .await
        .unwrap();
    store.end_in(&mut tx, &b, End::Complete).await.unwrap();
    tx.commit().await.unwrap();
    store
        .confirm_in(&mut pool.acquire().await.unwrap())
        .await
        .unwrap();
    assert_eq!(
        store.inspect(&stale).await.unwrap().state,
        RunState::Completed
    );
    assert_eq!(
        payments(&store, &table).await,
        [("stale".to_owned(), 2)],
        "one row, under the completion's fence"
    );
}

/// Transactional enqueue: runs created in the caller's transaction are invisible to
/// `claim_next` until it commits; a rollback leaves no run; a commit makes them claimable at
/// once, in order; `create_in` of an existing run is `AlreadyExists`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_enqueued_in_a_transaction_exist_only_if_it_commits() {
    let Some((store, _table)) = store_and_payments().await else {
        return;
    };
    let pool = store.pool().clone();
    let (a, b, c) = (id("job-a"), id("job-b"), id("job-c"));

    let mut tx = pool.begin().await.unwrap();
    let record = store.create_in(&mut tx, &a).await.unwrap();
    assert_eq!((record.state, record.fence.get()), (RunState::Runnable, 0));
    let batch = store
        .create_many_in(&mut tx, &[b.clone(), c.clone(), b.clone()])
        .await
        .unwrap();
    assert!(matches!(
        batch[..],
        [Ok(()), Ok(()), Err(Error::AlreadyExists { .. })]
    ));
    // Uncommitted: no other session sees them.
    let seen = store
        .claim_next(&worker("w"), ttl(60_000), 10)
        .await
        .unwrap();
    assert!(seen.is_empty(), "claim_next saw uncommitted runs: {seen:?}");
    tx.rollback().await.unwrap();
    for run in [&a, &b, &c] {
        assert!(matches!(
            store.inspect(run).await,
            Err(Error::NotFound { .. })
        ));
    }

    let mut tx = pool.begin().await.unwrap();
    store.create_in(&mut tx, &a).await.unwrap();
    store
        .create_many_in(&mut tx, &[b.clone(), c.clone()])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let claimed: Vec<String> = store
        .claim_next(&worker("w"), ttl(60_000), 10)
        .await
        .unwrap()
        .iter()
        .map(|l| l.run().to_string())
        .collect();
    assert_eq!(claimed, ["job-a", "job-b", "job-c"]);

    let mut tx = pool.begin().await.unwrap();
    let err = store.create_in(&mut tx, &a).await.unwrap_err();
    assert!(matches!(err, Error::AlreadyExists { .. }), "{err:?}");
    tx.rollback().await.unwrap();
}

/// Begins a transaction at `level` on `pool` and takes its snapshot now (the first statement).
async fn snapshot_at(
    pool: &sqlx::PgPool,
    level: &str,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(&format!("SET TRANSACTION ISOLATION LEVEL {level}"))
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
    tx
}

/// The purge of a run committed after the snapshot of the caller's REPEATABLE READ (or
/// SERIALIZABLE) transaction: `create_in` of the id there reads the fence floor in that
/// snapshot, from before the purge raised it, and creates the run below its last fence; the
/// first claim of the new life lifts it above the floor, so it takes fence 2 and the purged
/// life's fence-1 lease is stale. Under READ COMMITTED the statement sees the purge and creates
/// at the floor. A second transaction whose snapshot predates that creation is refused,
/// retryably, saying why (REPEATABLE READ, SERIALIZABLE), or told the run exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_in_whose_snapshot_predates_a_purge_never_reissues_a_fence() {
    let Some((store, _)) = store_and_payments().await else {
        return;
    };
    let pool = store.pool().clone();
    for level in ["REPEATABLE READ", "SERIALIZABLE", "READ COMMITTED"] {
        let run = id(&format!("purged-{}", level.replace(' ', "-")));
        let floor = store.create(&run).await.unwrap().fence.get();
        let old = store.claim(&run, &worker("a"), ttl(60_000)).await.unwrap();
        assert_eq!(old.fence().get(), floor + 1);
        store.complete(&old).await.unwrap();

        let mut tx = snapshot_at(&pool, level).await;
        let mut batch_tx = snapshot_at(&pool, level).await;
        assert_eq!(
            store.purge(Duration::ZERO, 100).await.unwrap(),
            std::slice::from_ref(&run),
            "{level}"
        );
        let created = store.create_in(&mut tx, &run).await.unwrap();
        let seen_floor = if level == "READ COMMITTED" {
            old.fence().get() // the statement's own snapshot sees the purge
        } else {
            floor // the transaction's snapshot predates it
        };
        assert_eq!(created.fence.get(), seen_floor, "{level}");
        tx.commit().await.unwrap();
        let batched = store
            .create_many_in(&mut batch_tx, std::slice::from_ref(&run))
            .await;
        if level == "READ COMMITTED" {
            assert!(
                matches!(&batched.unwrap()[0], Err(Error::AlreadyExists { .. })),
                "{level}"
            );
        } else {
            let err = batched.map(drop).unwrap_err();
            assert!(
                matches!(err, Error::Unavailable { .. }) && err.is_retryable(),
                "{level}: {err:?}"
            );
            assert!(
                err.to_string().contains("created by another transaction"),
                "{level}: {err}"
            );
        }
        batch_tx.rollback().await.unwrap();
        let next = store.claim(&run, &worker("b"), ttl(60_000)).await.unwrap();
        assert_eq!(
            next.fence().get(),
            old.fence().get() + 1,
            "{level}: no fence issued twice"
        );
        match store.append(&old, b"late").await {
            Err(Error::StaleFence {
                presented, current, ..
            }) if presented == old.fence().get() && current == next.fence().get() => {}
            other => panic!("{level}: the purged life's lease wrote: {other:?}"),
        }
    }
}

/// The migration that keeps purged runs as rows turns every tombstone into a purged row, and
/// raises a live run the old race created below its tombstone to it: applied over a schema at
/// the previous migration holding both, a create of the tombstoned id starts at its fence, and
/// the run created below it claims above it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_migration_turns_tombstones_into_purged_rows_and_raises_runs_below_them() {
    use sqlx::Connection;
    let Some(url) = postgres_url().await else {
        return;
    };
    let schema = unique_namespace("tomb_mig");
    let plain = url.split('?').next().unwrap().to_owned();
    let mut conn = sqlx::PgConnection::connect(&plain).await.unwrap();
    for sql in [
        format!("CREATE SCHEMA \"{schema}\""),
        format!("SET search_path TO \"{schema}\""),
    ] {
        sqlx::query(&sql).execute(&mut conn).await.unwrap();
    }
    // The schema as it was before purged runs kept their rows.
    const PURGED_ROWS: i64 = 20261203000000;
    let all = lease_postgres::migrator();
    assert!(all.iter().any(|m| m.version == PURGED_ROWS));
    let previous = sqlx::migrate::Migrator {
        migrations: std::borrow::Cow::Owned(
            all.iter()
                .filter(|m| m.version < PURGED_ROWS)
                .cloned()
                .collect(),
        ),
        ..sqlx::migrate::Migrator::DEFAULT
    };
    previous.run(&mut conn).await.unwrap();
    for sql in [
        // "lost" was purged at fence 5; "raced" too, then created again at fence 0 by the race.
        "INSERT INTO tombstones (run_id, fence) VALUES ('lost', 5), ('raced', 7)",
        "INSERT INTO runs (run_id, fence) VALUES ('raced', 0), ('alive', 3)",
    ] {
        sqlx::query(sql).execute(&mut conn).await.unwrap();
    }
    conn.close().await.unwrap();

    let store = PostgresLeaseStore::connect(PostgresConfig::from_url(url).with_schema(schema))
        .await
        .unwrap();
    assert!(matches!(
        store.inspect(&id("lost")).await,
        Err(Error::NotFound { .. })
    ));
    assert_eq!(store.create(&id("lost")).await.unwrap().fence.get(), 5);
    assert_eq!(store.inspect(&id("raced")).await.unwrap().fence.get(), 7);
    assert_eq!(store.inspect(&id("alive")).await.unwrap().fence.get(), 3);
    let lease = store
        .claim(&id("raced"), &worker("a"), ttl(60_000))
        .await
        .unwrap();
    assert_eq!(lease.fence().get(), 8);
}

/// In a new transaction: the caller's row `approval-1`, then `token`'s signal, delivered (not a
/// duplicate); the transaction, open.
async fn approve_in_tx(
    store: &PostgresLeaseStore,
    insert: &str,
    token: &lease_core::SignalToken,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query(insert)
        .bind("approval-1")
        .bind(1_i64)
        .execute(&mut *tx)
        .await
        .unwrap();
    assert!(
        !store
            .signal_tx(&mut tx, token, b"yes")
            .await
            .unwrap()
            .duplicate
    );
    tx
}

/// A signal in the caller's transaction (`signal_tx`) commits with the caller's row or not at
/// all: rolled back, the run still waits and the row is not there; committed, both landed, and
/// the next claim reads the signal. A second delivery in another transaction answers a
/// duplicate, an earlier wait's token is refused without failing the caller's transaction, and
/// a token another key signed is refused before any statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_in_the_callers_transaction_commits_with_its_row() {
    let Some((store, table)) = store_and_payments().await else {
        return;
    };
    use lease_core::{LeaseStoreExt, SignalKey, SignalRefusal, SignalToken, WaitEnd};
    let insert = format!("INSERT INTO {table} VALUES ($1, $2)");
    let run = id("order-9");
    store.create(&run).await.unwrap();
    let lease = store.claim(&run, &worker("w"), ttl(60_000)).await.unwrap();
    let token = SignalToken::for_lease(&lease, "approval", None).unwrap();
    store
        .end_one(
            &lease,
            End::await_signal("approval", Duration::from_secs(60)).unwrap(),
        )
        .await
        .unwrap();

    let tx = approve_in_tx(&store, &insert, &token).await;
    tx.rollback().await.unwrap();
    assert_eq!(
        store.inspect(&run).await.unwrap().state,
        RunState::Suspended
    );
    assert!(payments(&store, &table).await.is_empty());

    let tx = approve_in_tx(&store, &insert, &token).await;
    tx.commit().await.unwrap();
    assert_eq!(
        payments(&store, &table).await,
        [("approval-1".to_owned(), 1)]
    );
    let mut tx = store.pool().begin().await.unwrap();
    assert!(
        store
            .signal_tx(&mut tx, &token, b"yes")
            .await
            .unwrap()
            .duplicate
    );
    tx.commit().await.unwrap();

    let resumed = store.claim(&run, &worker("w"), ttl(60_000)).await.unwrap();
    assert_eq!(
        resumed
            .resumed()
            .and_then(WaitEnd::signal)
            .map(|s| s.payload()),
        Some(&b"yes"[..])
    );
    store
        .end_one(
            &resumed,
            End::await_signal("approval", Duration::from_secs(60)).unwrap(),
        )
        .await
        .unwrap();
    let mut tx = store.pool().begin().await.unwrap();
    let refused = store.signal_tx(&mut tx, &token, b"yes").await;
    assert!(
        matches!(
            refused,
            Err(Error::StaleSignal {
                reason: SignalRefusal::EarlierWait,
                ..
            })
        ),
        "{refused:?}"
    );
    // The refusal wrote nothing and failed no statement: the transaction goes on.
    sqlx::query(&insert)
        .bind("approval-2")
        .bind(2_i64)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let signed = SignalToken::new(
        run.clone(),
        lease_core::SignalName::new("approval").unwrap(),
        resumed.fence(),
        Some(&SignalKey::new([9u8; 32]).unwrap()),
    );
    let mut tx = store.pool().begin().await.unwrap();
    let refused = store.signal_tx(&mut tx, &signed, b"yes").await;
    assert!(
        matches!(refused, Err(Error::InvalidInput(_))),
        "{refused:?}"
    );
    tx.rollback().await.unwrap();
    assert_eq!(
        store.inspect(&run).await.unwrap().state,
        RunState::Suspended
    );
}
