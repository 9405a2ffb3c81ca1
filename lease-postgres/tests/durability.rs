//! The store fails closed on a server that can lose an acknowledged claim: `fsync = off` is
//! refused unless `volatile=true` says the loss is accepted (then shown and warned), and
//! `synchronous_commit = off` at the server, database or role level is overridden on the
//! store's own sessions, which see `on`.
//!
//! These tests start their own servers. A server that cannot be started fails the test;
//! `LEASE_TEST_SKIP_SERVERS=1` skips instead.

use lease_conformance::fixtures::{unique_namespace, with_params, PostgresServer};
use lease_core::Error;
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
