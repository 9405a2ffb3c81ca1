//! Bounded row locks: a fenced transaction the server aborts on its own, a claim that gives up
//! behind a locked row, and `renew_many` that skips a locked row instead of waiting for it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_conformance::fixtures::{postgres_url, unique_namespace};
use lease_core::{Error, LeaseStore, RunId, Ttl, WorkerId};
use lease_postgres::{sqlx, PostgresConfig, PostgresLeaseStore};
use lease_runtime::{Heartbeats, RunScope, ScopeConfig};

fn config(url: &str) -> PostgresConfig {
    PostgresConfig::from_url(url).with_schema(unique_namespace("lease_bounds"))
}

fn id(s: &str) -> RunId {
    RunId::new(s).unwrap()
}

fn worker(s: &str) -> WorkerId {
    WorkerId::new(s).unwrap()
}

fn ttl(ms: u64) -> Ttl {
    Ttl::from_millis(ms).unwrap()
}

/// A caller-owned table for side effects written inside fenced transactions.
async fn side_table(store: &PostgresLeaseStore) -> String {
    let table = format!("\"{}\".effects", store.schema());
    sqlx::query(&format!(
        "CREATE TABLE {table} (run_id TEXT NOT NULL, fence BIGINT NOT NULL)"
    ))
    .execute(store.pool())
    .await
    .unwrap();
    table
}

/// A fenced transaction whose client goes quiet (as a frozen process would) is ended by the
/// server once it has been idle for its bound: the run is reclaimed within the holder's TTL plus
/// the floor plus the claim's lock wait, the late commit fails with a retryable error that says
/// why, and nothing the transaction wrote lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_fenced_transaction_is_aborted_by_the_server_and_its_commit_fails() {
    let Some(url) = postgres_url().await else {
        return;
    };
    let floor = Duration::from_millis(250);
    let store = PostgresLeaseStore::connect(
        config(&url).with_transaction_bound(floor, Duration::from_secs(60)),
    )
    .await
    .unwrap();
    let table = side_table(&store).await;
    let run = id("charge-frozen");
    store.create(&run).await.unwrap();
    let a_ttl = Duration::from_millis(600);
    let claimed_at = Instant::now();
    let a = store
        .claim(&run, &worker("a"), ttl(a_ttl.as_millis() as u64))
        .await
        .unwrap();
    let mut tx = store.fenced_transaction(&a).await.unwrap();
    assert!(
        tx.bound() >= floor && tx.bound() <= a_ttl,
        "bound {:?} is the lease's time left, at least the floor",
        tx.bound()
    );
    sqlx::query(&format!("INSERT INTO {table} VALUES ($1, $2)"))
        .bind(run.as_str())
        .bind(1_i64)
        .execute(&mut *tx)
        .await
        .unwrap();

    // b claims as soon as the store allows; a's transaction sits idle meanwhile.
    let b = loop {
        match store.claim(&run, &worker("b"), ttl(30_000)).await {
            Ok(lease) => break lease,
            Err(Error::Held { .. }) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) if e.is_retryable() => {} // waited out the lock wait behind a's row
            Err(e) => panic!("unexpected refusal: {e:?}"),
        }
        assert!(
            claimed_at.elapsed() < Duration::from_secs(10),
            "b never reclaimed"
        );
    };
    let reclaimed_after = claimed_at.elapsed();
    assert_eq!(b.fence().get(), 2);
    // TTL, plus the floor, plus one lock wait (1 s) a claim may spend behind the row, plus slack.
    let limit = a_ttl + floor + Duration::from_secs(1) + Duration::from_millis(500);
    assert!(
        reclaimed_after < limit,
        "reclaimed after {reclaimed_after:?}, beyond {limit:?}"
    );

    let err = tx.commit().await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("idle_in_transaction_session_timeout")
            || message.contains("closed")
            || message.contains("reset")
            || message.contains("broken pipe")
            || message.contains("unexpected end"),
        "the commit says the server ended the transaction: {message}"
    );
    let landed: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(landed, 0, "nothing the aborted transaction wrote landed");
    let err = store.fenced_transaction(&a).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::StaleFence {
                presented: 1,
                current: 2,
                ..
            }
        ),
        "{err:?}"
    );
}

/// A holder that runs a long statement inside its fenced transaction and then goes silent
/// (TTL 2 s; `pg_sleep(1.9)`; then nothing, as a frozen process sends nothing) keeps the row
/// past its lease's expiry, because the server's idle bound restarts after each statement. The
/// reclaim still comes within the documented bound: `2 × bound` past expiry (plus the
/// claimer's lock wait); the late commit fails and nothing the holder wrote lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_silent_after_a_long_statement_is_reclaimed_within_the_documented_bound() {
    let Some(url) = postgres_url().await else {
        return;
    };
    let lock_wait = Duration::from_millis(300);
    let store = PostgresLeaseStore::connect(config(&url).with_lock_wait(lock_wait))
        .await
        .unwrap();
    let table = side_table(&store).await;
    let run = id("charge-slow");
    store.create(&run).await.unwrap();
    let a_ttl = Duration::from_secs(2);
    let claimed_at = Instant::now();
    let a = store
        .claim(&run, &worker("a"), ttl(a_ttl.as_millis() as u64))
        .await
        .unwrap();
    let mut tx = store.fenced_transaction(&a).await.unwrap();
    let bound = tx.bound();
    sqlx::query(&format!("INSERT INTO {table} VALUES ($1, $2)"))
        .bind(run.as_str())
        .bind(1_i64)
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("SELECT pg_sleep(1.9)")
        .execute(&mut *tx)
        .await
        .unwrap();
    // Silent from here on: no statement, no commit.

    let expiry = claimed_at + a_ttl;
    let b = loop {
        match store.claim(&run, &worker("b"), ttl(30_000)).await {
            Ok(lease) => break lease,
            Err(Error::Held { .. }) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) if e.is_retryable() => {} // waited out the lock wait behind a's row
            Err(e) => panic!("unexpected refusal: {e:?}"),
        }
        assert!(
            claimed_at.elapsed() < Duration::from_secs(20),
            "b never reclaimed"
        );
    };
    let delay = Instant::now().saturating_duration_since(expiry);
    assert_eq!(b.fence().get(), 2);
    let documented = 2 * bound + lock_wait;
    eprintln!(
        "fenced transaction, TTL {a_ttl:?}, bound {bound:?}, pg_sleep(1.9) then silent: \
         reclaimed {delay:?} after expiry (documented bound {documented:?})"
    );
    assert!(
        delay <= documented + Duration::from_millis(300),
        "reclaimed {delay:?} after expiry, beyond the documented {documented:?}"
    );
    let err = tx.commit().await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    let landed: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(landed, 0, "nothing the silent holder wrote landed");
}

/// A claim of a run whose row is locked by an open fenced transaction waits at most the lock
/// wait, then is refused with a retryable error naming the lock; once the transaction commits,
/// the claim succeeds under the next fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_behind_a_locked_row_gives_up_after_the_lock_wait() {
    let Some(url) = postgres_url().await else {
        return;
    };
    let lock_wait = Duration::from_millis(300);
    let store = PostgresLeaseStore::connect(
        config(&url)
            .with_lock_wait(lock_wait)
            .with_transaction_bound(Duration::from_secs(10), Duration::from_secs(60)),
    )
    .await
    .unwrap();
    let run = id("locked-run");
    store.create(&run).await.unwrap();
    let a = store.claim(&run, &worker("a"), ttl(200)).await.unwrap();
    let tx = store.fenced_transaction(&a).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await; // a expires; its row stays locked

    let started = Instant::now();
    let err = store
        .claim(&run, &worker("b"), ttl(30_000))
        .await
        .unwrap_err();
    let waited = started.elapsed();
    assert!(
        matches!(
            err,
            Error::Unavailable {
                backend: "postgres",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("lock_timeout"), "{err}");
    assert!(
        waited >= lock_wait - Duration::from_millis(50) && waited < Duration::from_secs(3),
        "waited {waited:?} for a lock wait of {lock_wait:?}"
    );

    tx.commit().await.unwrap(); // still within its bound: a's write is accepted
    let b = store.claim(&run, &worker("b"), ttl(30_000)).await.unwrap();
    assert_eq!(b.fence().get(), 2);
}

/// While one run's row is locked by an open transaction, a hub renews 2,000 leases: `renew_many`
/// answers at once (it never waits for the row), the locked lease alone fails with a retryable
/// error saying its row is locked, every other lease renews on every tick, and the locked lease
/// renews again once the row is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewing_two_thousand_leases_skips_only_the_locked_row() {
    let Some(url) = postgres_url().await else {
        return;
    };
    let store = PostgresLeaseStore::connect(
        config(&url)
            .with_max_connections(8)
            .with_lock_wait(Duration::from_secs(5)),
    )
    .await
    .unwrap();
    let schema = store.schema().to_owned();
    sqlx::query(&format!(
        "INSERT INTO \"{schema}\".runs (run_id, fence) \
         SELECT 'run-' || lpad(g::text, 4, '0'), 0 FROM generate_series(1, 2000) AS g"
    ))
    .execute(store.pool())
    .await
    .unwrap();
    let dyn_store: Arc<dyn LeaseStore> = Arc::new(store.clone());
    let w = worker("w");
    let sent = tokio::time::Instant::now();
    let mut leases = store.claim_next(&w, ttl(4_000), 1_000).await.unwrap();
    leases.extend(store.claim_next(&w, ttl(4_000), 1_000).await.unwrap());
    assert_eq!(leases.len(), 2_000);
    let locked_run = id("run-0777");
    let locked_index = leases.iter().position(|l| *l.run() == locked_run).unwrap();

    let mut locker = store.pool().begin().await.unwrap();
    sqlx::query(&format!(
        "SELECT 1 FROM \"{schema}\".runs WHERE run_id = $1 FOR UPDATE"
    ))
    .bind(locked_run.as_str())
    .execute(&mut *locker)
    .await
    .unwrap();

    // One chunk by hand: the reason for the locked lease, and no wait (the lock wait is 5 s).
    let chunk = &leases[..1_000];
    let started = Instant::now();
    let results = store.renew_many(chunk).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "renew_many waited {:?}",
        started.elapsed()
    );
    for (lease, result) in chunk.iter().zip(&results) {
        if *lease.run() == locked_run {
            let err = result.as_ref().unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::Unavailable {
                        backend: "postgres",
                        ..
                    }
                ),
                "{err:?}"
            );
            assert!(
                err.to_string().contains("locked by another transaction"),
                "{err}"
            );
        } else {
            assert!(result.is_ok(), "{}: {result:?}", lease.run());
        }
    }

    // The hub: ticks every 400 ms over all 2,000 scopes.
    let hub = Heartbeats::new(dyn_store.clone(), Duration::from_millis(400)).unwrap();
    let scope_config = ScopeConfig::default().with_heartbeats(hub.clone());
    let scopes: Vec<RunScope> = leases
        .iter()
        .map(|l| RunScope::from_lease(dyn_store.clone(), l.clone(), sent, scope_config.clone()))
        .collect::<Result<_, _>>()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while hub.stats().ticks < 3 {
        assert!(
            Instant::now() < deadline,
            "the hub did not tick: {:?}",
            hub.stats()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = hub.stats();
    assert_eq!(stats.rejected, 0, "{stats:?}");
    assert_eq!(
        stats.failed, stats.ticks,
        "only the locked lease fails: {stats:?}"
    );
    assert_eq!(stats.renewed, 1_999 * stats.ticks, "{stats:?}");
    assert!(
        !scopes[locked_index].is_cancelled(),
        "a skipped row is no verdict"
    );

    let counts: Vec<(String, i64)> = sqlx::query_as(&format!(
        "SELECT run_id, heartbeats FROM \"{schema}\".runs ORDER BY run_id"
    ))
    .fetch_all(store.pool())
    .await
    .unwrap();
    for (run, heartbeats) in &counts {
        if run == locked_run.as_str() {
            assert_eq!(*heartbeats, 0, "the locked run was never renewed");
        } else {
            assert!(*heartbeats >= 3, "{run} renewed {heartbeats} times");
        }
    }

    // Free the row: the next tick renews it too.
    locker.rollback().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let record = store.inspect(&locked_run).await.unwrap();
        if record.heartbeats > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the freed run was not renewed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!scopes[locked_index].is_cancelled());
    drop(scopes);
}

/// Retention deletes: 300 runs with payloads, journals and idempotency keys, ended and purged,
/// leave no row of theirs in any table of the schema (the fence floor's one row, and the
/// migrations' bookkeeping, are all that is left), and an id created again is claimed above
/// its last fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purged_runs_leave_no_rows_behind() {
    let Some(url) = postgres_url().await else {
        return;
    };
    let store = PostgresLeaseStore::connect(config(&url)).await.unwrap();
    let churned = lease_conformance::churn_and_purge(&store, 300).await;
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables WHERE table_schema = $1",
    )
    .bind(store.schema())
    .fetch_all(store.pool())
    .await
    .unwrap();
    let mut rows = std::collections::BTreeMap::new();
    for table in &tables {
        let n: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM \"{}\".\"{table}\"",
            store.schema()
        ))
        .fetch_one(store.pool())
        .await
        .unwrap();
        rows.insert(table.clone(), n);
    }
    let total: i64 = rows.values().sum();
    eprintln!("rows left after 300 runs were purged: {total} {rows:?}");
    for table in ["runs", "journal", "run_payloads"] {
        assert_eq!(rows.get(table), Some(&0), "{table}: {rows:?}");
    }
    assert_eq!(rows.get("fence_floor"), Some(&1), "{rows:?}");
    assert!(total <= 30, "{total} rows left: {rows:?}");
    lease_conformance::a_churned_id_comes_back_above_its_fence(&store, &churned).await;
}
