//! Helpers shared by the tests that start their own primaries and standbys.
#![allow(dead_code)] // each test crate uses a part

use std::time::{Duration, Instant};

use lease_conformance::fixtures::unavailable;
use lease_core::{RunId, Ttl, WorkerId};
use lease_postgres::sqlx;

pub(crate) fn id(s: &str) -> RunId {
    RunId::new(s).unwrap()
}

pub(crate) fn worker(s: &str) -> WorkerId {
    WorkerId::new(s).unwrap()
}

pub(crate) fn ttl(ms: u64) -> Ttl {
    Ttl::from_millis(ms).unwrap()
}

/// Fails the test with one sentence when a server cannot be had (the fixtures' rule:
/// `LEASE_TEST_SKIP_SERVERS=1` skips instead).
pub(crate) fn or_fail<T>(started: Result<T, String>, what: &str) -> Option<T> {
    match started {
        Ok(server) => Some(server),
        Err(why) => unavailable(
            what,
            why,
            "install postgresql (apt-get install -y postgresql) and run as root or as a user \
             who can run initdb and pg_basebackup",
        ),
    }
}

pub(crate) async fn execute(url: &str, sql: &str) {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::query(sql).execute(&mut conn).await.unwrap();
    conn.close().await.unwrap();
}

/// Waits until `n` standbys stream from the primary at `url` and have flushed all its WAL.
pub(crate) async fn caught_up(url: &str, n: i64) {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    // The fixture runs with synchronous_commit = off; one synchronous commit flushes all the WAL
    // written before it, so the flush position then covers every earlier commit.
    sqlx::query("SET synchronous_commit = on")
        .execute(&mut conn)
        .await
        .unwrap();
    // A commit that wrote nothing but its xid is flushed lazily even so; this one writes a row.
    for sql in [
        "CREATE TABLE IF NOT EXISTS public.flush_marker (at TIMESTAMPTZ NOT NULL)",
        "INSERT INTO public.flush_marker VALUES (now())",
    ] {
        sqlx::query(sql).execute(&mut conn).await.unwrap();
    }
    let target: String = sqlx::query_scalar("SELECT pg_current_wal_flush_lsn()::text")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let flushed: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_replication \
             WHERE state = 'streaming' AND flush_lsn >= $1::pg_lsn",
        )
        .bind(&target)
        .fetch_one(&mut conn)
        .await
        .unwrap();
        if flushed >= n {
            break;
        }
        assert!(Instant::now() < deadline, "the standby did not catch up");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    conn.close().await.unwrap();
}

/// Records the timeline of the promoted server at `url` in `schema`'s binding, as the first
/// connection there of a store with `sync_replicas` does (a failover it accepts): for a test
/// that reads the promoted server through a store without `sync_replicas`, which refuses a
/// timeline it was not bound to.
pub(crate) async fn accept_failover(url: &str, schema: &str) {
    execute(
        url,
        &format!(
            "UPDATE \"{schema}\".cluster_binding SET timeline = \
             ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint"
        ),
    )
    .await;
}
