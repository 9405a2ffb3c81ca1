//! A caller cannot switch off the durability the store confirmed: whatever the caller's own
//! statements set (`SET LOCAL synchronous_commit = off`, or the session-level `SET`), every
//! commit that ends a lease or commits a fenced transaction is made with
//! `synchronous_commit = on` — the fenced transaction's commit with and without an end, the
//! caller's own transaction ended by `end_in`, and a batch of `PgEffect`s.
//!
//! The observable: the caller's table has a deferred constraint trigger, which runs at commit,
//! after every statement of the transaction (the store's ending statement included), and
//! records the `synchronous_commit` in force there, the one the server commits with.

use lease_conformance::fixtures::{postgres_url, unique_namespace};
use lease_core::{Effect, End, Ending, Lease, LeaseStore, RunId, Ttl, WorkerId};
use lease_postgres::{sqlx, PgEffect, PostgresConfig, PostgresLeaseStore};
use sqlx::Connection;

/// The two ways a caller's statement can turn synchronous commit off for its transaction.
const OFF: [&str; 2] = [
    "SET LOCAL synchronous_commit = off",
    "SET synchronous_commit = off",
];

/// A store in a fresh schema with the caller's table `payments(run_id)`, whose rows note at
/// commit the `synchronous_commit` in force into `settings(run_id, setting)`.
async fn store() -> Option<PostgresLeaseStore> {
    let url = postgres_url().await?;
    let store = PostgresLeaseStore::connect(
        PostgresConfig::from_url(url).with_schema(unique_namespace("commit_setting")),
    )
    .await
    .expect("connect");
    let s = format!("\"{}\"", store.schema());
    for statement in [
        format!("CREATE TABLE {s}.payments (run_id TEXT PRIMARY KEY)"),
        format!("CREATE TABLE {s}.settings (run_id TEXT PRIMARY KEY, setting TEXT NOT NULL)"),
        format!(
            "CREATE FUNCTION {s}.note_setting() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN INSERT INTO {s}.settings VALUES (NEW.run_id, \
             current_setting('synchronous_commit')); RETURN NULL; END $$"
        ),
        format!(
            "CREATE CONSTRAINT TRIGGER at_commit AFTER INSERT ON {s}.payments \
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {s}.note_setting()"
        ),
    ] {
        sqlx::query(&statement)
            .execute(store.pool())
            .await
            .expect(&statement);
    }
    Some(store)
}

fn payment(store: &PostgresLeaseStore) -> String {
    format!(
        "INSERT INTO \"{}\".payments (run_id) VALUES ($1)",
        store.schema()
    )
}

/// The `synchronous_commit` that `run`'s payment committed with.
async fn committed_with(store: &PostgresLeaseStore, run: &str) -> String {
    sqlx::query_scalar(&format!(
        "SELECT setting FROM \"{}\".settings WHERE run_id = $1",
        store.schema()
    ))
    .bind(run)
    .fetch_one(store.pool())
    .await
    .unwrap_or_else(|e| panic!("{run}'s payment did not commit: {e}"))
}

async fn claimed(store: &PostgresLeaseStore, run: &str) -> Lease {
    let run = RunId::new(run).unwrap();
    store.create(&run).await.unwrap();
    store
        .claim(
            &run,
            &WorkerId::new("w").unwrap(),
            Ttl::from_secs(60).unwrap(),
        )
        .await
        .unwrap()
}

/// A fenced transaction whose statements turn synchronous commit off commits with it on,
/// whether it ends its lease or only commits its writes. Before, a `commit()` without an end
/// committed asynchronously (the store's `on` came first, at the lock, and the caller's `off`
/// after it won).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_transaction_commits_synchronously_whatever_its_statements_set() {
    let Some(store) = store().await else { return };
    for (i, off) in OFF.iter().enumerate() {
        for ends in [false, true] {
            let run = format!("fenced-{i}-{}", if ends { "end" } else { "commit" });
            let lease = claimed(&store, &run).await;
            let mut tx = store.fenced_transaction(&lease).await.unwrap();
            sqlx::query(off).execute(&mut *tx).await.unwrap();
            sqlx::query(&payment(&store))
                .bind(&run)
                .execute(&mut *tx)
                .await
                .unwrap();
            if ends {
                tx.end(End::Complete).await.unwrap();
            } else {
                tx.commit().await.unwrap();
            }
            assert_eq!(committed_with(&store, &run).await, "on", "{run}: {off}");
        }
    }
}

/// The caller's own transaction, `fence_in`, a statement turning synchronous commit off, the
/// payment, `end_in` last: it commits with synchronous commit on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_callers_transaction_ended_by_end_in_commits_synchronously() {
    let Some(store) = store().await else { return };
    for (i, off) in OFF.iter().enumerate() {
        let run = format!("caller-{i}");
        let lease = claimed(&store, &run).await;
        let mut conn = store.pool().acquire().await.unwrap();
        let mut tx = conn.begin().await.unwrap();
        store.fence_in(&mut tx, &lease).await.unwrap();
        sqlx::query(off).execute(&mut *tx).await.unwrap();
        sqlx::query(&payment(&store))
            .bind(&run)
            .execute(&mut *tx)
            .await
            .unwrap();
        store.end_in(&mut tx, &lease, End::Complete).await.unwrap();
        tx.commit().await.unwrap();
        // The session-level setting outlives the transaction: not the store's to undo, but
        // this test's connection goes back to a pool.
        sqlx::query("RESET synchronous_commit")
            .execute(&mut *conn)
            .await
            .unwrap();
        assert_eq!(committed_with(&store, &run).await, "on", "{run}: {off}");
    }
}

/// A batch of `PgEffect`s, each turning synchronous commit off before its payment, commits
/// with it on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_effects_commits_synchronously_whatever_they_set() {
    let Some(store) = store().await else { return };
    let mut ends = Vec::new();
    let mut effects = Vec::new();
    for (i, off) in OFF.iter().enumerate() {
        let run = format!("effect-{i}");
        let lease = claimed(&store, &run).await;
        let sql = payment(&store);
        let effect: Effect = PgEffect::new(move |conn| {
            let (sql, run) = (sql.clone(), run.clone());
            Box::pin(async move {
                sqlx::query(off).execute(&mut *conn).await?;
                sqlx::query(&sql).bind(run).execute(&mut *conn).await?;
                Ok(())
            })
        })
        .into();
        ends.push(Ending::new(lease, End::Complete));
        effects.push(Some(effect));
    }
    for result in store.end_many_with_effects(&ends, &effects).await.unwrap() {
        result.unwrap();
    }
    for (i, off) in OFF.iter().enumerate() {
        let run = format!("effect-{i}");
        assert_eq!(committed_with(&store, &run).await, "on", "{run}: {off}");
    }
}

/// A fenced transaction one of whose statements failed (so the server aborted it) is not
/// reported committed: its commit is refused saying so, nothing of it is there, and the lease
/// is still held. Before, the COMMIT of the aborted transaction (which the server answers as a
/// rollback, without an error) was reported as done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_fenced_transaction_is_not_reported_committed() {
    let Some(store) = store().await else { return };
    let lease = claimed(&store, "aborted").await;
    let mut tx = store.fenced_transaction(&lease).await.unwrap();
    sqlx::query(&payment(&store))
        .bind("aborted")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("SELECT 1 / 0")
        .execute(&mut *tx)
        .await
        .expect_err("division by zero");
    let err = tx
        .commit()
        .await
        .expect_err("an aborted transaction reported committed");
    assert!(
        err.to_string().contains("already aborted"),
        "the refusal says why: {err}"
    );
    let rows: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM \"{}\".payments",
        store.schema()
    ))
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(rows, 0, "nothing of the transaction committed");
    let record = store.inspect(lease.run()).await.unwrap();
    assert_eq!(
        (record.fence, record.owner.is_some()),
        (lease.fence(), true),
        "the lease is still held"
    );
}

/// Whether the WAL of `conn`'s server is flushed up to `target`.
async fn flushed_to(conn: &mut sqlx::PgConnection, target: &str) -> bool {
    sqlx::query_scalar("SELECT pg_current_wal_flush_lsn() >= $1::pg_lsn")
        .bind(target)
        .fetch_one(conn)
        .await
        .unwrap()
}

/// The caller's exactly-once pattern committed asynchronously on `conn`: `fence_in`, the
/// payment, `end_in`, then `SET LOCAL synchronous_commit = off` after the store's last
/// statement, commit. Returns the WAL insert position right after the commit (past its record),
/// having checked that the commit is not flushed yet.
async fn pay_asynchronously(
    store: &PostgresLeaseStore,
    conn: &mut sqlx::PgConnection,
    lease: &Lease,
) -> String {
    let mut tx = conn.begin().await.unwrap();
    store.fence_in(&mut tx, lease).await.unwrap();
    sqlx::query(&payment(store))
        .bind(lease.run().as_str())
        .execute(&mut *tx)
        .await
        .unwrap();
    store.end_in(&mut tx, lease, End::Complete).await.unwrap();
    sqlx::query("SET LOCAL synchronous_commit = off")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let target: String = sqlx::query_scalar("SELECT pg_current_wal_insert_lsn()::text")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert!(
        !flushed_to(conn, &target).await,
        "the asynchronous commit was flushed at once: the WAL writer woke (the test's premise \
         failed, not the store)"
    );
    target
}

/// Without `sync_replicas`, a commit the caller made asynchronous after the store's last
/// statement is flushed before the store reports it done: by `confirm_in` on the committing
/// connection, and by a retried end answered "already ended under your fence" (what a
/// `Worker` confirming `End::Committed` and a retry of an unanswered end see). On a private
/// server whose WAL writer sleeps 10 s, so that only a flush the store asks for brings the
/// commit to disk in time. Before, both returned at once, and a crash then lost an end
/// reported committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asynchronous_commit_is_flushed_before_it_is_reported_done() {
    use lease_conformance::fixtures::PostgresServer;
    let server = match PostgresServer::start() {
        Ok(server) => server,
        Err(why) => {
            return lease_conformance::fixtures::unavailable(
                "a postgres server",
                why,
                "install postgresql (apt-get install -y postgresql)",
            )
            .unwrap_or(())
        }
    };
    {
        let mut admin = sqlx::PgConnection::connect(&server.url()).await.unwrap();
        for sql in [
            "ALTER SYSTEM SET wal_writer_delay = '10s'",
            "ALTER SYSTEM SET autovacuum = off",
            "SELECT pg_reload_conf()",
        ] {
            sqlx::query(sql).execute(&mut admin).await.unwrap();
        }
    }
    let store = PostgresLeaseStore::connect(
        PostgresConfig::from_url(server.url()).with_schema(unique_namespace("async_flush")),
    )
    .await
    .expect("connect");
    sqlx::query(&format!(
        "CREATE TABLE \"{}\".payments (run_id TEXT PRIMARY KEY)",
        store.schema()
    ))
    .execute(store.pool())
    .await
    .unwrap();
    let mut conn = store.pool().acquire().await.unwrap();

    let lease = claimed(&store, "confirmed-in").await;
    let target = pay_asynchronously(&store, &mut conn, &lease).await;
    store.confirm_in(&mut conn).await.unwrap();
    assert!(
        flushed_to(&mut conn, &target).await,
        "confirm_in returned before the commit (WAL {target}) was flushed"
    );

    let lease = claimed(&store, "retried").await;
    let target = pay_asynchronously(&store, &mut conn, &lease).await;
    let err = store.complete(&lease).await.unwrap_err();
    assert!(
        matches!(err, lease_core::Error::LeaseEnded { fence, .. } if fence == lease.fence().get()),
        "{err:?}"
    );
    assert!(
        flushed_to(&mut conn, &target).await,
        "\"already ended under your fence\" was answered before that end (WAL {target}) was \
         flushed"
    );
}
