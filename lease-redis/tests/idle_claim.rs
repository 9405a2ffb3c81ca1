//! An idle worker's poll costs the server one command inside its script.
//!
//! A `claim_next` on a kind with nothing in its claimable indexes (an emptied sorted set is
//! deleted) and no restore marker answers after one `EXISTS` over those keys: no clock read,
//! no marker read, no range read per priority (it was twelve commands a poll: `GET`, `TIME` and
//! ten `ZRANGEBYSCORE`s). Once an index holds an entry, even one not yet due, the script reads
//! as before; a restored namespace is still reported (`tests/restore.rs`).

use std::collections::HashMap;
use std::time::Duration;

use lease_conformance::fixtures::{unavailable, unique_namespace, RedisOptions, RedisServer};
use lease_core::{LeaseStore, NewRun, RunId, Ttl, WorkerId};
use lease_redis::{RedisConfig, RedisLeaseStore};
use redis::aio::MultiplexedConnection;

/// Polls measured on each side.
const POLLS: u64 = 20;

fn server() -> Option<RedisServer> {
    match RedisServer::start_options(RedisOptions::default()) {
        Ok(server) => Some(server),
        Err(why) => unavailable(
            "redis-server",
            why,
            "install redis-server (bash scripts/test.sh does it)",
        ),
    }
}

/// `cmdstat_<name>` → calls, from `INFO commandstats` (a script's commands counted too).
async fn calls(conn: &mut MultiplexedConnection) -> HashMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect()
}

/// The commands `POLLS` calls of `claim_next` ran, the store's own and those in its scripts.
async fn polls(store: &RedisLeaseStore, conn: &mut MultiplexedConnection) -> HashMap<String, u64> {
    let worker = WorkerId::new("idle-worker").unwrap();
    let ttl = Ttl::from_secs(30).unwrap();
    // The first call of a connection loads the script (`EVALSHA` refused, `SCRIPT LOAD`).
    store.claim_next(&worker, ttl, 8).await.unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .unwrap();
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
async fn an_idle_poll_runs_one_command_in_its_script() {
    let Some(server) = server() else {
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
    let script_calls =
        idle.get("evalsha").copied().unwrap_or(0) + idle.get("eval").copied().unwrap_or(0);
    assert_eq!(script_calls, POLLS, "one script call a poll: {idle:?}");
    assert_eq!(
        idle.get("exists"),
        Some(&POLLS),
        "one EXISTS a poll: {idle:?}"
    );
    let total: u64 = idle.values().sum();
    assert_eq!(
        total,
        2 * POLLS,
        "an idle poll runs its script and one command in it, nothing else: {idle:?}"
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
    assert!(
        waiting.get("zrangebyscore").copied().unwrap_or(0) >= POLLS,
        "with an index to read, each poll reads it: {waiting:?}"
    );
}
