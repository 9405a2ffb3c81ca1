//! Heartbeats as HOT updates: renewals change no indexed column, so a held run's entry in the
//! claim-order index lags behind its expiry; claim_next must still find every claimable run, in
//! order, past any number of lagging entries, and a renewed lease that expires is reclaimed.

use std::time::{Duration, Instant};

use lease_conformance::fixtures::{postgres_url, required, unique_namespace, PostgresServer};
use lease_core::{Lease, LeaseStore, RunId, Ttl, WorkerId};
use lease_postgres::{sqlx, PostgresConfig, PostgresLeaseStore};

fn config(url: &str) -> PostgresConfig {
    PostgresConfig::from_url(url).with_schema(unique_namespace("lease_hot"))
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

/// `lease` as renewed with another TTL (a lease's TTL is what each renewal extends it by).
fn with_ttl(lease: &Lease, ms: u64) -> Lease {
    Lease::new(
        lease.run().clone(),
        lease.owner().clone(),
        lease.fence(),
        ttl(ms),
        lease.expires_at(),
    )
    .unwrap()
}

/// `(n_tup_upd, n_tup_hot_upd)` of the store's runs table.
async fn update_counts(store: &PostgresLeaseStore) -> (i64, i64) {
    sqlx::query_as(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables \
         WHERE schemaname = $1 AND relname = 'runs'",
    )
    .bind(store.schema())
    .fetch_one(store.pool())
    .await
    .unwrap()
}

/// The update counts once at least `updates` updates are visible. Statistics reach the shared
/// counters asynchronously: the store's one session is asked to flush at its next idle moment
/// (`pg_stat_force_next_flush`, PostgreSQL 15), and the counters are polled for up to 20 s.
async fn counts_after(store: &PostgresLeaseStore, updates: i64) -> (i64, i64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        sqlx::query("SELECT pg_stat_force_next_flush()")
            .execute(store.pool())
            .await
            .unwrap();
        let counts = update_counts(store).await;
        if counts.0 >= updates {
            return counts;
        }
        assert!(
            Instant::now() < deadline,
            "only {counts:?} updates of {updates} reached pg_stat_user_tables in 20 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// 200 renewals (100 through `renew_many`, 100 through `renew`) are at least 90% HOT updates,
/// and renew the runs. On a private server: a HOT update needs room on its row's page, which
/// pruning the row's dead versions makes, and the shared server's other tests can hold the
/// pruning back (a transaction open in the same database did; with a database of its own, a
/// run beside the PgBouncer tests still read 160 of 200, with no snapshot held in the
/// database at the end), so the page fills with versions no one may remove.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_are_hot_updates() {
    let Some(server) = required(
        "postgres",
        PostgresServer::start(),
        "install postgresql (bash scripts/test.sh does it)",
    ) else {
        return;
    };
    let url = server.url();
    // One session, so that one flush request covers every statement.
    let store = PostgresLeaseStore::connect(config(&url).with_max_connections(1))
        .await
        .unwrap();
    // No autovacuum on the table: an ANALYZE the renewals trigger holds a snapshot while it
    // runs, and with it the pruning HOT updates need (once: 160 of 200 in a CI run).
    sqlx::raw_sql(&format!(
        "ALTER TABLE \"{}\".runs SET (autovacuum_enabled = false)",
        store.schema()
    ))
    .execute(store.pool())
    .await
    .unwrap();
    let runs: Vec<RunId> = (0..10).map(|i| id(&format!("beat-{i}"))).collect();
    store.create_many(&runs).await.unwrap();
    let mut leases = Vec::new();
    for run in &runs {
        leases.push(store.claim(run, &worker("w"), ttl(60_000)).await.unwrap());
    }
    let (claims, _) = counts_after(&store, 10).await;
    assert_eq!(claims, 10, "one update per claim, nothing else");
    let hot_before = update_counts(&store).await.1;

    for _ in 0..10 {
        let renewed = store.renew_many(&leases).await.unwrap();
        assert!(renewed.iter().all(Result::is_ok), "{renewed:?}");
    }
    for _ in 0..10 {
        for lease in &leases {
            store.renew(lease).await.unwrap();
        }
    }
    let (updates, hot) = counts_after(&store, claims + 200).await;
    let renewals = updates - claims;
    let hot = hot - hot_before;
    eprintln!(
        "{hot} of {renewals} renewals were HOT updates ({:.1}%)",
        100.0 * hot as f64 / renewals as f64
    );
    assert_eq!(renewals, 200);
    // On failure, who held a snapshot in this database: what kept the pages from pruning.
    let holders: Vec<(String, String, String, String)> = sqlx::query_as(
        "SELECT coalesce(datname, ''), coalesce(backend_type, ''), coalesce(state || ': ' || query, ''), \
         backend_xmin::text FROM pg_stat_activity WHERE backend_xmin IS NOT NULL \
         AND pid <> pg_backend_pid()",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert!(
        hot * 10 >= renewals * 9,
        "{hot} of {renewals} HOT; snapshots held in the database now: {holders:?}"
    );
    for run in &runs {
        assert_eq!(store.inspect(run).await.unwrap().heartbeats, 20);
    }
}

/// The lease's index entry as `(claimable_at, lease_expires_at)` in microseconds.
async fn entry(store: &PostgresLeaseStore, run: &RunId) -> (i64, Option<i64>) {
    sqlx::query_as(&format!(
        "SELECT (extract(epoch FROM claimable_at) * 1000000)::bigint, \
                (extract(epoch FROM lease_expires_at) * 1000000)::bigint \
         FROM \"{}\".runs WHERE run_id = $1",
        store.schema()
    ))
    .bind(run.as_str())
    .fetch_one(store.pool())
    .await
    .unwrap()
}

/// A lease renewed past the expiry of its claim is not handed out while held (its entry lags,
/// and claim_next moves it forward), and is handed out once its renewed lease expires, under the
/// next fence, never before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_lease_that_then_expires_is_claimed_by_claim_next() {
    let Some(url) = postgres_url().await else {
        return;
    };
    let store = PostgresLeaseStore::connect(config(&url)).await.unwrap();
    let run = id("renewed");
    store.create(&run).await.unwrap();
    let a = store.claim(&run, &worker("a"), ttl(100)).await.unwrap();
    let sent = Instant::now();
    store.renew(&with_ttl(&a, 1_500)).await.unwrap();
    let (claimable_at, expires_at) = entry(&store, &run).await;
    assert!(
        claimable_at < expires_at.unwrap(),
        "the renewal left the claim's index key"
    );

    tokio::time::sleep(Duration::from_millis(300)).await;
    // Lagging: claimable_at has passed, the lease is held.
    assert!(store
        .claim_next(&worker("b"), ttl(60_000), 10)
        .await
        .unwrap()
        .is_empty());
    let (moved, expires_at) = entry(&store, &run).await;
    assert_eq!(
        Some(moved),
        expires_at,
        "claim_next moved the lagging entry to the expiry"
    );

    let b = loop {
        let got = store
            .claim_next(&worker("b"), ttl(60_000), 10)
            .await
            .unwrap();
        if let Some(lease) = got.into_iter().next() {
            break lease;
        }
        assert!(sent.elapsed() < Duration::from_secs(6), "never reclaimed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let after = sent.elapsed();
    assert!(
        after >= Duration::from_millis(1_500),
        "handed out {after:?} after a renewal of 1.5 s was sent"
    );
    assert_eq!((b.run(), b.fence().get()), (&run, 2));
}

/// A renewed lease that expires with its entry never moved (no claim_next ran meanwhile) is
/// handed out by the next claim_next; within the batch it comes after a run queued before its
/// renewed expiry, as the instant it became claimable says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_then_expired_lease_is_claimed_in_the_order_of_its_expiry() {
    let Some(url) = postgres_url().await else {
        return;
    };
    let store = PostgresLeaseStore::connect(config(&url)).await.unwrap();
    let (renewed, queued) = (id("renewed"), id("queued"));
    store.create(&renewed).await.unwrap();
    let a = store.claim(&renewed, &worker("a"), ttl(100)).await.unwrap();
    store.renew(&with_ttl(&a, 1_500)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    store.create(&queued).await.unwrap();
    let queued_at = entry(&store, &queued).await.0;
    let (lagging_key, expires_at) = entry(&store, &renewed).await;
    assert!(
        lagging_key < queued_at && queued_at < expires_at.unwrap(),
        "precondition: queued between the claim's expiry and the renewed one"
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    let got = store
        .claim_next(&worker("b"), ttl(60_000), 10)
        .await
        .unwrap();
    let order: Vec<&RunId> = got.iter().map(Lease::run).collect();
    assert_eq!(order, [&queued, &renewed]);
    assert_eq!(got[1].fence().get(), 2);
}

/// A lease renewed with a shorter TTL than its claim's is claimable at its new, earlier expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_renewed_shorter_is_claimable_at_its_new_expiry() {
    let Some(url) = postgres_url().await else {
        return;
    };
    let store = PostgresLeaseStore::connect(config(&url)).await.unwrap();
    let run = id("shortened");
    store.create(&run).await.unwrap();
    let a = store.claim(&run, &worker("a"), ttl(60_000)).await.unwrap();
    let renewed = store.renew_many(&[with_ttl(&a, 200)]).await.unwrap();
    assert!(renewed[0].is_ok());
    tokio::time::sleep(Duration::from_millis(400)).await;
    let got = store
        .claim_next(&worker("b"), ttl(60_000), 10)
        .await
        .unwrap();
    assert_eq!(got.len(), 1, "the shortened lease expired and is claimable");
    assert_eq!(got[0].fence().get(), 2);
}

/// With 1,000 held leases whose entries lag at the head of the index, claim_next(max) still
/// returns max runs while at least max are claimable (the lagging entries are skipped inside the
/// scan, before LIMIT), and each call moves a bounded number of lagging entries forward.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_next_returns_max_runs_past_a_thousand_lagging_entries() {
    let Some(url) = postgres_url().await else {
        return;
    };
    let store = PostgresLeaseStore::connect(config(&url)).await.unwrap();
    let held: Vec<RunId> = (0..1_000).map(|i| id(&format!("held-{i:04}"))).collect();
    store.create_many(&held).await.unwrap();
    let leases = store
        .claim_next(&worker("w"), ttl(100), 1_000)
        .await
        .unwrap();
    assert_eq!(leases.len(), 1_000);
    let long: Vec<Lease> = leases.iter().map(|l| with_ttl(l, 120_000)).collect();
    let renewed = store.renew_many(&long).await.unwrap();
    assert!(renewed.iter().all(Result::is_ok));
    let fresh: Vec<RunId> = (0..1_010).map(|i| id(&format!("fresh-{i:04}"))).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    store.create_many(&fresh[..1_000]).await.unwrap();
    store.create_many(&fresh[1_000..]).await.unwrap();

    let lagging = || async {
        let n: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM \"{}\".runs \
             WHERE claimable_at <= now() AND lease_expires_at > now()",
            store.schema()
        ))
        .fetch_one(store.pool())
        .await
        .unwrap();
        n
    };
    assert_eq!(lagging().await, 1_000);

    let started = Instant::now();
    let got = store
        .claim_next(&worker("b"), ttl(60_000), 10)
        .await
        .unwrap();
    eprintln!(
        "claim_next(10) past 1,000 lagging entries: {:?}",
        started.elapsed()
    );
    let order: Vec<RunId> = got.iter().map(|l| l.run().clone()).collect();
    assert_eq!(order, &fresh[..10], "the 10 longest claimable, in order");
    assert_eq!(lagging().await, 1_000 - 256, "one call moves 256 entries");

    let started = Instant::now();
    let got = store
        .claim_next(&worker("b"), ttl(60_000), 1_000)
        .await
        .unwrap();
    eprintln!(
        "claim_next(1000) past 744 lagging entries: {:?}",
        started.elapsed()
    );
    let order: Vec<RunId> = got.iter().map(|l| l.run().clone()).collect();
    assert_eq!(order, &fresh[10..]);
    // It took fewer than max, so it walked (and may move from) the whole claimable range.
    assert_eq!(lagging().await, 1_000 - 512);
    // None of the held runs was handed out, and their holders still hold them.
    for lease in long.iter().step_by(97) {
        assert!(store.renew(lease).await.is_ok());
    }
    while lagging().await > 0 {
        assert!(store
            .claim_next(&worker("b"), ttl(60_000), 1)
            .await
            .unwrap()
            .is_empty());
    }
}
