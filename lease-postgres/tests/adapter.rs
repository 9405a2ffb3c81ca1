//! Postgres-specific behaviour beyond the conformance suite: hostile ids, password redaction,
//! server restarts, pool exhaustion, fenced transactions and concurrent migrations.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lease_conformance::assert_unavailable;
use lease_conformance::fixtures::{postgres_url, unavailable, unique_namespace, PostgresServer};
use lease_core::{Ended, Error, LeaseStore, ListFilter, RunId, Ttl, WorkerId};
use lease_postgres::{sqlx, PostgresConfig, PostgresLeaseStore};

const HINT: &str = "set DATABASE_URL or install PostgreSQL (apt-get install -y postgresql)";

/// A server of this test's own, for tests that restart it or need its password role.
fn own_server() -> Option<PostgresServer> {
    match PostgresServer::start() {
        Ok(server) => Some(server),
        Err(why) => unavailable("a private postgres server", why, HINT),
    }
}

fn config(url: &str) -> PostgresConfig {
    PostgresConfig::from_url(url).with_schema(unique_namespace("lease_adapter"))
}

async fn store(url: &str) -> PostgresLeaseStore {
    PostgresLeaseStore::connect(config(url))
        .await
        .expect("connect")
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_id_full_of_sql_metacharacters_is_stored_verbatim() {
    let Some(url) = postgres_url().await else {
        return;
    };
    let store = store(&url).await;
    let hostile = "'); DROP TABLE runs; -- \"quoted\" \\ $1 %_ {schema} ;' OR '1'='1 ∑ ñ";
    let run = id(hostile);
    store.create(&run).await.unwrap();
    let lease = store
        .claim(&run, &worker("w'\";--"), ttl(30_000))
        .await
        .unwrap();
    assert_eq!(lease.run().as_str(), hostile);
    store.append(&lease, b"payload ' \" \0 \\").await.unwrap();
    let record = store.inspect(&run).await.unwrap();
    assert_eq!(record.run.as_str(), hostile);
    assert_eq!(record.owner.unwrap().as_str(), "w'\";--");
    let listed = store.list(&ListFilter::default()).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].run.as_str(), hostile);
    let journal = store.journal(&run).await.unwrap();
    assert_eq!(journal[0].payload, b"payload ' \" \0 \\");
    assert!(matches!(
        store.create(&run).await.unwrap_err(),
        Error::AlreadyExists { run: r } if r.as_str() == hostile
    ));
}

/// Records every tracing event and span field, to check the password is never logged.
#[derive(Default, Clone)]
struct Capture(Arc<Mutex<String>>);

struct Fields<'a>(&'a mut String);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write;
        let _ = write!(self.0, " {}={:?}", field.name(), value);
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn register_callsite(
        &self,
        _: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::always()
    }
    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::TRACE)
    }
    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        span.record(&mut Fields(&mut self.0.lock().unwrap()));
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        values.record(&mut Fields(&mut self.0.lock().unwrap()));
    }
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut log = self.0.lock().unwrap();
        log.push('\n');
        event.record(&mut Fields(&mut log));
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// The capturing subscriber, the process's global default from the first call on. A
/// thread-local default (`set_default`) missed every event in one CI run: tracing caches each
/// call site's interest for all threads, and another test's thread can register a call site
/// while the cache is rebuilt for the new subscriber. The global default sees every thread's
/// events: the other tests' logs are checked too (their servers' passwords differ, and the
/// wrong password below is this test's alone).
fn capture() -> Capture {
    static CAPTURE: std::sync::OnceLock<Capture> = std::sync::OnceLock::new();
    CAPTURE
        .get_or_init(|| {
            let capture = Capture::default();
            tracing::subscriber::set_global_default(capture.clone())
                .expect("no other subscriber in this test process");
            capture
        })
        .clone()
}

#[tokio::test]
async fn the_password_never_appears_in_errors_logs_or_debug_output() {
    let Some(server) = own_server() else { return };
    let capture = capture();
    let password = server.password().to_owned();
    let good_url = server.password_url();
    assert!(good_url.contains(&password));
    let mut shown = Vec::new();

    // The right password: the store works, and neither it nor its config shows the password.
    let good = config(&good_url);
    shown.push(format!("{good:?} {good}"));
    let store = PostgresLeaseStore::connect(good.clone()).await.unwrap();
    store.create(&id("r")).await.unwrap();
    shown.push(format!("{store:?} {store}"));

    // A wrong password: refused by the server, a non-retryable failure.
    let wrong = "Wr0ngPassw0rdXYZ";
    let bad_url = good_url.replace(&password, wrong);
    let err =
        PostgresLeaseStore::connect(config(&bad_url).with_acquire_timeout(Duration::from_secs(3)))
            .await
            .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Backend {
                backend: "postgres",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("password authentication failed"),
        "{err}"
    );
    shown.push(format!("{err} {err:?}"));

    // An unreachable server: retryable, and still no password.
    let dead_url = format!(
        "postgres://lease_pw:{password}@127.0.0.1:{}/postgres",
        lease_conformance::fixtures::free_port()
    );
    let err = PostgresLeaseStore::connect(
        config(&dead_url).with_acquire_timeout(Duration::from_millis(500)),
    )
    .await
    .unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    shown.push(format!("{err} {err:?}"));

    // A malformed URL that still carries a password.
    let err = PostgresLeaseStore::connect(PostgresConfig::from_url(format!(
        "postgres://u:{password}@host:notaport/db"
    )))
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Misconfigured { .. }), "{err:?}");
    shown.push(format!("{err} {err:?}"));

    let logged = capture.0.lock().unwrap().clone();
    assert!(!logged.is_empty(), "the capturing subscriber saw no events");
    shown.push(logged);
    for text in &shown {
        assert!(!text.contains(&password), "password leaked: {text}");
        assert!(!text.contains(wrong), "wrong password leaked: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_gives_retryable_errors_then_recovery_with_higher_fences() {
    let Some(server) = own_server() else { return };
    let store = PostgresLeaseStore::connect(
        config(&server.url()).with_acquire_timeout(Duration::from_secs(1)),
    )
    .await
    .unwrap();
    let run = id("restarted");
    store.create(&run).await.unwrap();
    let first = store.claim(&run, &worker("a"), ttl(200)).await.unwrap();
    assert_eq!(first.fence().get(), 1);

    server.stop().unwrap();
    for _ in 0..3 {
        let started = Instant::now();
        let err = store.claim(&run, &worker("b"), ttl(200)).await.unwrap_err();
        assert_unavailable(&err, "postgres");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "took {:?}",
            started.elapsed()
        );
        let err = store
            .append(&first, b"during the outage")
            .await
            .unwrap_err();
        assert!(err.is_retryable(), "{err:?}");
    }

    server.start_again().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let record = loop {
        match store.inspect(&run).await {
            Ok(record) => break record,
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("no recovery after restart: {e:?}"),
        }
    };
    assert_eq!(record.fence.get(), 1);
    tokio::time::sleep(Duration::from_millis(250)).await; // the first lease expires
    let second = store.claim(&run, &worker("b"), ttl(30_000)).await.unwrap();
    assert_eq!(second.fence().get(), 2);
    let err = store.append(&first, b"stale").await.unwrap_err();
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
    store.append(&second, b"fresh").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_pool_times_out_with_a_retryable_error() {
    let Some(url) = postgres_url().await else {
        return;
    };
    let store = PostgresLeaseStore::connect(
        config(&url)
            .with_max_connections(1)
            .with_acquire_timeout(Duration::from_millis(500))
            .with_lock_wait(Duration::from_secs(5)),
    )
    .await
    .unwrap();
    let run = id("busy");
    store.create(&run).await.unwrap();
    let lease = store.claim(&run, &worker("a"), ttl(30_000)).await.unwrap();
    // A fenced transaction (on the caller's pool) holds the row; a renewal then waits for it
    // on the store pool's only connection.
    let held = store.fenced_transaction(&lease).await.unwrap();
    let waiting = {
        let (store, lease) = (store.clone(), lease.clone());
        tokio::spawn(async move { store.renew(&lease).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;

    let started = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(10), store.inspect(&run)).await;
    let err = outcome
        .expect("an exhausted pool must not hang")
        .unwrap_err();
    assert_unavailable(&err, "postgres");
    assert!(err.to_string().contains("timed out"), "{err}");
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );

    held.rollback().await.unwrap();
    waiting
        .await
        .unwrap()
        .expect("the renewal goes on once the row is free");
    assert_eq!(store.inspect(&run).await.unwrap().fence.get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_transaction_commits_only_under_the_current_fence() {
    let Some(url) = postgres_url().await else {
        return;
    };
    // A floor wide enough that the transaction held below outlives b's lease by design.
    let store = PostgresLeaseStore::connect(
        config(&url).with_transaction_bound(Duration::from_secs(5), Duration::from_secs(60)),
    )
    .await
    .unwrap();
    let table = format!("public.{}", unique_namespace("side_effects"));
    sqlx::query(&format!(
        "CREATE TABLE {table} (run_id TEXT NOT NULL, fence BIGINT NOT NULL, note TEXT NOT NULL)"
    ))
    .execute(store.pool())
    .await
    .unwrap();
    let insert = format!("INSERT INTO {table} (run_id, fence, note) VALUES ($1, $2, $3)");
    let count = format!("SELECT count(*) FROM {table} WHERE note = $1");
    let rows = |note: &'static str| {
        let count = count.clone();
        let pool = store.pool().clone();
        async move {
            sqlx::query_scalar::<_, i64>(&count)
                .bind(note)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };

    let run = id("charge-42");
    store.create(&run).await.unwrap();
    let a = store.claim(&run, &worker("a"), ttl(150)).await.unwrap();

    // Under the current fence, the caller's insert commits.
    let mut tx = store.fenced_transaction(&a).await.unwrap();
    assert_eq!(tx.lease(), &a);
    sqlx::query(&insert)
        .bind(run.as_str())
        .bind(1_i64)
        .bind("current")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(rows("current").await, 1);

    // Dropped without commit: nothing lands.
    let mut tx = store.fenced_transaction(&a).await.unwrap();
    sqlx::query(&insert)
        .bind(run.as_str())
        .bind(1_i64)
        .bind("dropped")
        .execute(&mut *tx)
        .await
        .unwrap();
    drop(tx);
    assert_eq!(rows("dropped").await, 0);

    // a is paused past its TTL; b reclaims; a's transaction is refused by fence, and no row lands.
    tokio::time::sleep(Duration::from_millis(250)).await;
    let b = store.claim(&run, &worker("b"), ttl(200)).await.unwrap();
    assert_eq!(b.fence().get(), 2);
    // Written as a caller would: the insert runs only inside an accepted transaction.
    let err = match store.fenced_transaction(&a).await {
        Ok(mut tx) => {
            sqlx::query(&insert)
                .bind(run.as_str())
                .bind(1_i64)
                .bind("stale")
                .execute(&mut *tx)
                .await
                .unwrap();
            tx.commit().await.unwrap();
            panic!("a fenced transaction under a stale fence committed");
        }
        Err(err) => err,
    };
    assert!(
        matches!(&err, Error::StaleFence { run: r, presented: 1, current: 2 } if *r == run),
        "{err:?}"
    );
    assert_eq!(rows("stale").await, 0);

    // While b's transaction is open, a reclaim (b has expired) waits; it cannot interleave.
    let mut tx = store.fenced_transaction(&b).await.unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await; // b expires by the store clock
    let reclaim = tokio::spawn({
        let store = store.clone();
        let run = run.clone();
        async move { store.claim(&run, &worker("c"), ttl(30_000)).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !reclaim.is_finished(),
        "a claim interleaved with an open fenced transaction"
    );
    sqlx::query(&insert)
        .bind(run.as_str())
        .bind(2_i64)
        .bind("while held")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let c = reclaim.await.unwrap().unwrap();
    assert_eq!(c.fence().get(), 3);
    assert_eq!(rows("while held").await, 1);

    // b's fence is now stale too; an ended lease gets its own reason.
    let err = store.fenced_transaction(&b).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::StaleFence {
                presented: 2,
                current: 3,
                ..
            }
        ),
        "{err:?}"
    );
    store.release(&c).await.unwrap();
    let err = store.fenced_transaction(&c).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::LeaseEnded {
                fence: 3,
                ended: Ended::Released,
                ..
            }
        ),
        "{err:?}"
    );
    let err = store
        .fenced_transaction(
            &lease_core::Lease::new(
                id("nope"),
                worker("x"),
                lease_core::Fence::new(1).unwrap(),
                ttl(10),
                lease_core::StoreTime::default(),
            )
            .unwrap(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err:?}");
    sqlx::query(&format!("DROP TABLE {table}"))
        .execute(store.pool())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_concurrent_connects_migrate_an_empty_schema_once() {
    let Some(url) = postgres_url().await else {
        return;
    };
    let schema = unique_namespace("lease_migrate");
    let connects = (0..8).map(|_| {
        let config = PostgresConfig::from_url(&url)
            .with_schema(&schema)
            .with_max_connections(2)
            .with_acquire_timeout(Duration::from_secs(30));
        tokio::spawn(PostgresLeaseStore::connect(config))
    });
    let mut stores = Vec::new();
    for connect in connects {
        stores.push(
            connect
                .await
                .unwrap()
                .expect("every concurrent connect succeeds"),
        );
    }
    let pool = stores[0].pool().clone();
    let schemas: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_namespace WHERE nspname = $1")
        .bind(&schema)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(schemas, 1);
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1",
    )
    .bind(&schema)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        tables,
        [
            "_sqlx_migrations",
            "cluster_binding",
            "fence_floor",
            "journal",
            "queues",
            "run_payloads",
            "runs"
        ]
    );
    let applied: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM \"{schema}\"._sqlx_migrations WHERE success"
    ))
    .fetch_one(&pool)
    .await
    .unwrap();
    let migrations = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"))
        .unwrap()
        .count();
    assert_eq!(applied, migrations as i64, "each migration applied once");
    // Every store sees the same runs.
    stores[3].create(&id("shared")).await.unwrap();
    assert_eq!(
        stores[7].inspect(&id("shared")).await.unwrap().fence.get(),
        0
    );

    // A store over an existing pool in the same schema migrates nothing new and works.
    let config = lease_postgres::PostgresConfig::for_pool()
        .with_schema(schema.clone())
        .with_volatile(true);
    let over_pool = PostgresLeaseStore::from_pool(pool, config).await.unwrap();
    assert!(over_pool.inspect(&id("shared")).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_at_the_largest_fence_is_exhausted_never_wrapped() {
    let Some(url) = postgres_url().await else {
        return;
    };
    let store = store(&url).await;
    let run = id("worn-out");
    store.create(&run).await.unwrap();
    let sql = format!(
        "UPDATE \"{}\".runs SET fence = 9223372036854775807 WHERE run_id = $1",
        store.schema()
    );
    sqlx::query(&sql)
        .bind(run.as_str())
        .execute(store.pool())
        .await
        .unwrap();
    let err = store
        .claim(&run, &worker("a"), ttl(1_000))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::FenceExhausted { run: r } if *r == run),
        "{err:?}"
    );
    assert!(store
        .claim_next(&worker("a"), ttl(1_000), 10)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        store.inspect(&run).await.unwrap().fence,
        lease_core::Fence::MAX
    );
}

/// `sync_replicas=1` against a server with no synchronous standby configured fails closed at
/// connect with `Misconfigured`, in one sentence naming the setting and the fix; a misspelled
/// parameter is refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_replicas_without_synchronous_standbys_is_misconfigured() {
    let Some(url) = postgres_url().await else {
        return;
    };
    let err = PostgresLeaseStore::connect(
        config(&url)
            .with_sync_replicas(1)
            .with_acquire_timeout(Duration::from_secs(1)),
    )
    .await
    .unwrap_err();
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
    let message = err.to_string();
    assert!(
        message.contains("synchronous_standby_names is empty")
            && message.contains("set synchronous_standby_names"),
        "{message}"
    );
    let separator = if url.contains('?') { '&' } else { '?' };
    let err = PostgresLeaseStore::connect(config(&format!("{url}{separator}sync_replica=1")))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Misconfigured { .. }) && err.to_string().contains("\"sync_replica\""),
        "{err:?}"
    );
}

/// A host list whose first host is down: the store connects to the next one, which is the
/// primary, and works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_list_skips_a_host_that_is_down() {
    let Some(url) = postgres_url().await else {
        return;
    };
    let dead = format!("127.0.0.1:{}", lease_conformance::fixtures::free_port());
    let (head, tail) = match url.rfind('@') {
        Some(at) => url.split_at(at + 1),
        None => url.split_at(url.find("://").expect("a URL") + 3),
    };
    let listed = format!("{head}{dead},{tail}");
    let store =
        PostgresLeaseStore::connect(config(&listed).with_acquire_timeout(Duration::from_secs(2)))
            .await
            .unwrap();
    let run = id("listed");
    store.create(&run).await.unwrap();
    let lease = store.claim(&run, &worker("a"), ttl(30_000)).await.unwrap();
    assert_eq!(lease.fence().get(), 1);
}

/// `migrate=false` (the URL) or `with_migrations(false)`: connecting runs no DDL at all, and
/// a schema without this release's migrations is refused by name before any operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_migrations_nothing_is_created_and_an_unmigrated_schema_is_refused() {
    let Some(url) = postgres_url().await else {
        return;
    };
    let schema = unique_namespace("lease_nomigrate");
    let sep = if url.contains('?') { '&' } else { '?' };
    let no_ddl = PostgresConfig::from_url(format!("{url}{sep}migrate=false")).with_schema(&schema);
    let err = PostgresLeaseStore::connect(no_ddl.clone())
        .await
        .expect_err("an unmigrated schema is refused");
    assert!(
        matches!(&err, Error::Misconfigured { .. })
            && err.to_string().contains("has no migrations")
            && err.to_string().contains(&schema),
        "{err}"
    );
    // Nothing was created: not even the schema.
    let probe = store(&url).await;
    let schemas: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_namespace WHERE nspname = $1")
        .bind(&schema)
        .fetch_one(probe.pool())
        .await
        .unwrap();
    assert_eq!(schemas, 0, "migrate=false created the schema");

    // Migrated once, the same configuration connects and works, still running no DDL.
    let migrating = PostgresLeaseStore::connect(config(&url).with_schema(&schema))
        .await
        .unwrap();
    migrating.create(&id("made")).await.unwrap();
    let read_only = PostgresLeaseStore::connect(no_ddl).await.unwrap();
    assert_eq!(read_only.inspect(&id("made")).await.unwrap().fence.get(), 0);

    // The setter overrides the URL, in both directions.
    let other = unique_namespace("lease_nomigrate");
    let err = PostgresLeaseStore::connect(config(&url).with_schema(&other).with_migrations(false))
        .await
        .expect_err("with_migrations(false) is refused on an empty schema");
    assert!(err.to_string().contains("has no migrations"), "{err}");
    let forced = PostgresConfig::from_url(format!("{url}{sep}migrate=false"))
        .with_schema(&other)
        .with_migrations(true);
    PostgresLeaseStore::connect(forced).await.unwrap();

    // A bad value is refused, naming the parameter.
    let err =
        PostgresLeaseStore::connect(PostgresConfig::from_url(format!("{url}{sep}migrate=nah")))
            .await
            .expect_err("migrate=nah");
    assert!(err.to_string().contains("migrate=\"nah\""), "{err}");
}

/// The schema's format version is its newest migration ([`lease_postgres::format_version`]): a
/// schema a later release migrated is refused by name, with and without migrations, and by
/// `migrate`, before anything is read or written; a schema at an older format (the trace
/// parents', signals' and queues' migrations undone, as a release before them left it) is
/// migrated up, its runs kept, and they land in the default queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_format_is_refused_and_an_older_one_migrated_up() {
    let Some(url) = postgres_url().await else {
        return;
    };
    let schema = unique_namespace("lease_format");
    let store = PostgresLeaseStore::connect(config(&url).with_schema(&schema))
        .await
        .unwrap();
    store.create(&id("before")).await.unwrap();
    assert_eq!(
        lease_postgres::format_version(),
        20261220000000,
        "the trace parents' migration"
    );
    let newer = lease_postgres::format_version() + 1;
    sqlx::query(&format!(
        "INSERT INTO {schema}._sqlx_migrations \
             (version, description, success, checksum, execution_time) \
         VALUES ($1, 'a later release', true, '\\x00'::bytea, 0)"
    ))
    .bind(newer)
    .execute(store.pool())
    .await
    .unwrap();
    for migrate in [true, false] {
        let err =
            PostgresLeaseStore::connect(config(&url).with_schema(&schema).with_migrations(migrate))
                .await
                .expect_err("a newer format is refused");
        let text = err.to_string();
        assert!(
            matches!(&err, Error::Misconfigured { .. })
                && text.contains(&format!("is at format {newer}, newer than this release's"))
                && text.contains(&schema),
            "migrate={migrate}: {text}"
        );
    }
    let err = store.migrate().await.expect_err("migrate refuses it too");
    assert!(
        err.to_string().contains("newer than this release's"),
        "{err}"
    );

    // Back to the format before queues: the migrations' rows gone, their DDL undone.
    sqlx::query(&format!(
        "DELETE FROM {schema}._sqlx_migrations WHERE version >= 20261218000000"
    ))
    .execute(store.pool())
    .await
    .unwrap();
    for statement in [
        format!("ALTER TABLE {schema}.run_payloads DROP COLUMN trace_parent"),
        format!("ALTER TABLE {schema}.run_payloads ALTER COLUMN payload SET NOT NULL"),
        format!("DROP INDEX {schema}.runs_waits"),
        format!(
            "ALTER TABLE {schema}.runs DROP COLUMN wait_name, DROP COLUMN wait_deadline, \
             DROP COLUMN wait_fence, DROP COLUMN resumed_name, DROP COLUMN resumed_fence, \
             DROP COLUMN resumed_at, DROP COLUMN resumed_payload"
        ),
        format!("DROP TABLE {schema}.queues"),
        format!("DROP INDEX {schema}.runs_claimable"),
        format!("ALTER TABLE {schema}.runs DROP COLUMN queue"),
        format!(
            "CREATE INDEX runs_claimable ON {schema}.runs \
             (kind, priority, claimable_at, created_seq) WHERE state = 'runnable'"
        ),
    ] {
        sqlx::query(&statement).execute(store.pool()).await.unwrap();
    }
    let err = PostgresLeaseStore::connect(config(&url).with_schema(&schema).with_migrations(false))
        .await
        .expect_err("an older format without migrations is refused");
    assert!(
        err.to_string().contains("is at migration 20261217000000"),
        "{err}"
    );
    let upgraded = PostgresLeaseStore::connect(config(&url).with_schema(&schema))
        .await
        .unwrap();
    let record = upgraded.inspect(&id("before")).await.unwrap();
    assert!(record.queue.is_default(), "{record:?}");
    let leases = upgraded
        .claim_next_in(
            &lease_core::Queue::default(),
            &lease_core::Kind::default(),
            &worker("w"),
            ttl(30_000),
            10,
        )
        .await
        .unwrap();
    assert_eq!(leases.len(), 1);
    assert_eq!(leases[0].run().as_str(), "before");
}

/// `from_pool` keeps the adapter's settings: the durability check runs on the caller's pool
/// (the test server runs with fsync off, which only `volatile` accepts), and
/// `with_migrations(false)` holds there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_over_the_callers_pool_keeps_every_setting() {
    let Some(url) = postgres_url().await else {
        return;
    };
    let plain = url.split('?').next().unwrap().to_owned();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&plain)
        .await
        .unwrap();
    let schema = unique_namespace("lease_pool");
    let fsync: String = sqlx::query_scalar("SHOW fsync")
        .fetch_one(&pool)
        .await
        .unwrap();
    let strict = PostgresLeaseStore::from_pool(
        pool.clone(),
        PostgresConfig::for_pool().with_schema(unique_namespace("lease_pool")),
    )
    .await;
    match (fsync.as_str(), strict) {
        ("on", Ok(_)) => {}
        ("on", Err(e)) => panic!("a safe server's pool is refused: {e}"),
        (_, Ok(_)) => panic!("fsync={fsync} accepted without volatile through a pool"),
        (_, Err(err)) => assert!(
            matches!(&err, Error::Misconfigured { .. }) && err.to_string().contains("fsync"),
            "{err}"
        ),
    }
    let err = PostgresLeaseStore::from_pool(
        pool.clone(),
        PostgresConfig::for_pool()
            .with_schema(&schema)
            .with_volatile(true)
            .with_migrations(false),
    )
    .await
    .expect_err("no migrations on a pool either");
    assert!(err.to_string().contains("has no migrations"), "{err}");
    let store = PostgresLeaseStore::from_pool(
        pool,
        PostgresConfig::for_pool()
            .with_schema(&schema)
            .with_volatile(true),
    )
    .await
    .unwrap();
    store.create(&id("pooled")).await.unwrap();
    assert_eq!(
        store.accepted_risks().is_empty(),
        fsync == "on",
        "volatile shows what it accepted"
    );
}

/// The read that explains a refused claim takes its clock when it reads the row. A release that
/// begins after the reading transaction did but commits before its snapshot stamps the run
/// claimable at a later time than that transaction's `now()`: read against `now()`, the run
/// given back without a delay looked delayed by a few hundred microseconds, and a claim racing
/// the release was refused as `Delayed` (seen under load in `failover.rs`'s eight workers).
/// Here the reading transaction starts first and holds still while the release commits.
#[tokio::test]
async fn a_run_released_without_a_delay_never_reads_as_delayed() {
    let Some(url) = postgres_url().await else {
        return;
    };
    let store = PostgresLeaseStore::connect(config(&url)).await.unwrap();
    let run = id("released");
    store.create(&run).await.unwrap();
    let lease = store.claim(&run, &worker("a"), ttl(60_000)).await.unwrap();

    let explain = lease_postgres::render_sql(include_str!("../sql/explain.sql"), store.schema());
    let mut tx = store.pool().begin().await.unwrap();
    // The transaction's start: now() from here on.
    sqlx::query("SELECT now()").execute(&mut *tx).await.unwrap();
    store.release(&lease).await.unwrap();
    let after_start: bool = sqlx::query_scalar(&format!(
        "SELECT claimable_at > now() FROM \"{}\".runs WHERE run_id = $1",
        store.schema()
    ))
    .bind(run.as_str())
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert!(
        after_start,
        "the release's timestamp should follow the reading transaction's start"
    );
    let row = sqlx::query(&explain)
        .bind(run.as_str())
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let delay: Option<i64> = sqlx::Row::get(&row, "delay_us");
    let owner: Option<String> = sqlx::Row::get(&row, "lease_owner");
    tx.rollback().await.unwrap();
    assert_eq!(owner, None, "the release committed before the read");
    assert_eq!(
        delay, None,
        "a run released without a delay read as delayed"
    );
    let again = store.claim(&run, &worker("b"), ttl(60_000)).await.unwrap();
    assert!(again.fence() > lease.fence());
}
