//! The store fails closed on a server that can lose an acknowledged claim: `fsync = off` is
//! refused unless `volatile=true` says the loss is accepted (then shown and warned), and
//! `synchronous_commit = off` at the server, database or role level is overridden on the
//! store's own sessions, which see `on`.
//!
//! These tests start their own servers. A server that cannot be started fails the test;
//! `LEASE_TEST_SKIP_SERVERS=1` skips instead.

use lease_conformance::fixtures::{unique_namespace, with_params, PostgresServer};
use lease_core::{Error, LeaseStore};
use lease_postgres::{sqlx, PostgresConfig, PostgresLeaseStore};

mod support;
use support::{execute, or_fail};

/// The server's URL without the `volatile=true` the fixture adds to a non-durable server's.
fn bare(server: &PostgresServer) -> String {
    format!("postgres://postgres@127.0.0.1:{}/postgres", server.port())
}

/// A server running with `fsync = off` is refused at connect with a configuration error
/// naming `fsync` and the way out; with `volatile=true` it is accepted, the store's `Display`
/// and `accepted_risks` say what was accepted.
#[tokio::test]
async fn fsync_off_is_refused_unless_volatile() {
    let Some(server) = or_fail(PostgresServer::start(), "a postgres server") else {
        return;
    };
    let schema = unique_namespace("fsync");
    let err =
        PostgresLeaseStore::connect(PostgresConfig::from_url(bare(&server)).with_schema(&schema))
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
        message.contains("fsync = off") && message.contains("volatile=true"),
        "{message}"
    );
    assert!(!err.is_retryable());
    eprintln!("fsync off: refused: {message}");

    let store = PostgresLeaseStore::connect(
        PostgresConfig::from_url(with_params(&bare(&server), "volatile=true")).with_schema(&schema),
    )
    .await
    .unwrap();
    assert_eq!(store.accepted_risks(), ["fsync off"]);
    let shown = store.to_string();
    assert!(
        shown.contains("volatile") && shown.contains("fsync off"),
        "{shown}"
    );
    eprintln!("fsync off with volatile=true: {shown}");
}

/// On a durable server whose `synchronous_commit` is off for the whole server, for the
/// database and for the role, the store connects without `volatile` and every one of its
/// sessions sees `synchronous_commit = on` (set at connect, checked on each new connection),
/// even when the URL's `options` ask for `off`; a plain session of the same role still sees
/// `off`, so the override is the store's.
#[tokio::test]
async fn synchronous_commit_off_is_overridden_on_the_stores_sessions() {
    let Some(server) = or_fail(PostgresServer::start_durable(), "a durable postgres server") else {
        return;
    };
    let url = server.url();
    for sql in [
        "ALTER SYSTEM SET synchronous_commit = off",
        "SELECT pg_reload_conf()",
        "ALTER DATABASE postgres SET synchronous_commit = off",
        "ALTER ROLE postgres SET synchronous_commit = off",
    ] {
        execute(&url, sql).await;
    }
    let plain = sqlx::PgPool::connect(&url).await.unwrap();
    let seen: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(&plain)
        .await
        .unwrap();
    assert_eq!(
        seen, "off",
        "the test must set up a server that does not wait"
    );
    plain.close().await;

    for url in [
        url.clone(),
        with_params(&url, "options=-c%20synchronous_commit%3Doff"),
    ] {
        let store = PostgresLeaseStore::connect(
            PostgresConfig::from_url(&url)
                .with_schema(unique_namespace("synccommit"))
                .with_max_connections(3),
        )
        .await
        .unwrap();
        assert!(store.accepted_risks().is_empty(), "{store}");
        // Every pooled connection, not just the first.
        let mut held = Vec::new();
        for _ in 0..3 {
            let mut conn = store.pool().acquire().await.unwrap();
            let seen: String = sqlx::query_scalar("SHOW synchronous_commit")
                .fetch_one(&mut *conn)
                .await
                .unwrap();
            assert_eq!(seen, "on", "a store session of {url} sees {seen}");
            held.push(conn);
        }
    }
}

/// A durable primary with an asynchronous streaming standby: without `sync_replicas` a store
/// is refused at connect, through its own URL and through `from_pool` alike, with one sentence
/// naming `sync_replicas=N` and the narrow opt-in (a standby promoted after a failure would
/// lack the last acknowledged claims and issue their fences again). `async_standbys=accept`
/// accepts exactly that risk and no other: `accepted_risks` and `Display` name it, without
/// `volatile`. A standby that attaches after a store connected is refused on the store's next
/// new connection.
#[tokio::test]
async fn streaming_standbys_without_sync_replicas_are_refused_unless_accepted() {
    let Some(primary) = or_fail(PostgresServer::start_durable(), "a durable postgres server")
    else {
        return;
    };
    let url = bare(&primary);
    let schema = unique_namespace("standbys");
    // Before any standby: accepted, nothing risky; it keeps a connection for later.
    let early = PostgresLeaseStore::connect(
        PostgresConfig::from_url(&url)
            .with_schema(&schema)
            .with_max_connections(1),
    )
    .await
    .unwrap();
    assert!(early.accepted_risks().is_empty(), "{early}");
    let Some(_standby) = or_fail(PostgresServer::standby_of(&primary), "a standby") else {
        return;
    };
    support::caught_up(&url, 1).await;

    let refused = PostgresLeaseStore::connect(PostgresConfig::from_url(&url).with_schema(&schema))
        .await
        .unwrap_err();
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let through_pool = PostgresLeaseStore::from_pool(
        pool.clone(),
        PostgresConfig::for_pool().with_schema(&schema),
    )
    .await
    .unwrap_err();
    for err in [&refused, &through_pool] {
        assert!(matches!(err, Error::Misconfigured { .. }), "{err:?}");
        let shown = err.to_string();
        assert!(
            shown.contains("1 standby(s) replicate")
                && shown.contains("sync_replicas=N")
                && shown.contains("async_standbys=accept"),
            "{shown}"
        );
    }
    let accepted = PostgresLeaseStore::connect(
        PostgresConfig::from_url(with_params(&url, "async_standbys=accept")).with_schema(&schema),
    )
    .await
    .unwrap();
    assert_eq!(
        accepted.accepted_risks(),
        ["standbys without sync_replicas".to_owned()]
    );
    let shown = accepted.to_string();
    assert!(
        shown.contains("[accepts standbys without sync_replicas") && !shown.contains("volatile"),
        "{shown}"
    );
    let pooled = PostgresLeaseStore::from_pool(
        pool,
        PostgresConfig::for_pool()
            .with_schema(&schema)
            .with_async_standbys_accepted(true),
    )
    .await
    .unwrap();
    assert_eq!(pooled.accepted_risks().len(), 1, "{pooled}");

    // The store connected before the standby: its next new connection is checked too.
    execute(
        &url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name LIKE 'lease-postgres %' AND pid <> pg_backend_pid()",
    )
    .await;
    let err = loop {
        match early
            .create(&lease_core::RunId::new("after").unwrap())
            .await
        {
            Err(e) if e.to_string().contains("async_standbys=accept") => break e,
            Err(e) if e.is_retryable() => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await
            }
            other => panic!("a standby attached under a running store went unnoticed: {other:?}"),
        }
    };
    eprintln!("a standby attached, sync_replicas=0: {err}");
}
