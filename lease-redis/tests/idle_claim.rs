//! An idle worker's poll costs the server one command.
//!
//! Once a `claim_next` of a kind has found nothing, the store's next one first sends one
//! read-only `EXISTS` over the kind's claimable indexes and the restore marker (an emptied
//! sorted set is deleted), and answers at once when none is there: no script, no clock read,
//! no range read per priority (it was thirteen commands a poll: the `EVALSHA`, `GET`, `TIME`
//! and ten `ZRANGEBYSCORE`s). Once an index holds an entry, even one not yet due, the script
//! runs as before; a restored namespace is still reported (`tests/restore.rs`).

use std::collections::HashMap;
use std::time::Duration;

use lease_conformance::fixtures::{required, unique_namespace, RedisServer};
use lease_core::{LeaseStore, NewRun, RunId, Ttl, WorkerId};
use lease_redis::{RedisConfig, RedisLeaseStore};
use redis::aio::MultiplexedConnection;

mod support;

/// Polls measured on each side.
const POLLS: u64 = 20;

/// `cmdstat_<name>` → calls (a script's commands counted too).
async fn calls(conn: &mut MultiplexedConnection) -> HashMap<String, u64> {
    let stats = support::commandstats(conn).await;
    stats
        .into_iter()
        .map(|(name, (calls, _))| (name, calls))
        .collect()
}

/// The commands `POLLS` calls of `claim_next` ran, the store's own and those in its scripts.
async fn polls(store: &RedisLeaseStore, conn: &mut MultiplexedConnection) -> HashMap<String, u64> {
    let worker = WorkerId::new("idle-worker").unwrap();
    let ttl = Ttl::from_secs(30).unwrap();
    // The first call of a connection loads the script (`EVALSHA` refused, `SCRIPT LOAD`), and
    // finding nothing, marks the kind idle.
    store.claim_next(&worker, ttl, 8).await.unwrap();
    support::reset(conn).await;
    for _ in 0..POLLS {
        let claimed = store.claim_next(&worker, ttl, 8).await.unwrap();
        assert!(claimed.is_empty(), "nothing is claimable: {claimed:?}");
    }
    let mut seen = calls(conn).await;
    // The test's own INFO is counted once it has run.
    seen.remove("info");
    seen.remove("config|resetstat");
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_poll_sends_one_command() {
    let hint = "install redis-server (bash scripts/test.sh does it)";
    let Some(server) = required("redis-server", RedisServer::start(), hint) else {
        return;
    };
    let store = RedisLeaseStore::connect(
        RedisConfig::from_url(server.url()).with_namespace(unique_namespace("idle_claim")),
    )
    .await
    .unwrap();
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();

    let idle = polls(&store, &mut conn).await;
    assert_eq!(
        idle,
        HashMap::from([("exists".to_owned(), POLLS)]),
        "an idle poll sends one EXISTS and nothing else"
    );

    // A run that is not due yet: its index exists, so the poll reads it, and finds nothing due.
    store
        .create_many_with(&[
            NewRun::new(RunId::new("later").unwrap()).with_delay(Duration::from_secs(3600))
        ])
        .await
        .unwrap()
        .into_iter()
        .for_each(|created| created.unwrap());
    let waiting = polls(&store, &mut conn).await;
    assert_eq!(
        waiting.get("evalsha"),
        Some(&POLLS),
        "with an index to read, each poll runs the script: {waiting:?}"
    );
    assert!(
        waiting.get("zrangebyscore").copied().unwrap_or(0) >= POLLS,
        "with an index to read, each poll reads it: {waiting:?}"
    );

    // Claimed, the kind is busy again: the script runs without the question first.
    store.create(&RunId::new("now").unwrap()).await.unwrap();
    let worker = WorkerId::new("busy-worker").unwrap();
    let claimed = store
        .claim_next(&worker, Ttl::from_secs(30).unwrap(), 8)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1, "{claimed:?}");
    support::reset(&mut conn).await;
    let after = store
        .claim_next(&worker, Ttl::from_secs(30).unwrap(), 8)
        .await
        .unwrap();
    assert!(after.is_empty(), "{after:?}");
    let seen = calls(&mut conn).await;
    assert_eq!(
        (seen.get("evalsha"), seen.get("exists")),
        (Some(&1), None),
        "after a claim that found runs, the next poll runs the script straight away: {seen:?}"
    );
}
