//! The durability guard on real servers: eviction, `appendfsync everysec` (and the OS-crash
//! loss it allows), a forbidden `CONFIG`, and a server restarted without persistence under a
//! running store and scope.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_conformance::fixtures::{unique_namespace, RedisOptions};
use lease_core::{Error, LeaseStore};
use lease_runtime::{CancelReason, RunScope, ScopeConfig};

use super::{assert_misconfigured, config, connect, run, say, server, ttl, worker};
use lease_redis::RedisLeaseStore;

/// `maxmemory-policy allkeys-*` is refused, naming the setting; `noeviction` and
/// `volatile-lru` are accepted as safe (the adapter sets an expiry on none of its keys, so a
/// `volatile-*` policy evicts none of them); with `volatile=true` an `allkeys-*` policy is
/// accepted and shown.
#[tokio::test]
async fn an_allkeys_eviction_policy_is_refused_and_noeviction_accepted() {
    let Some(server) = server(
        RedisOptions::default()
            .with_maxmemory("100mb")
            .with_maxmemory_policy("allkeys-lru"),
    ) else {
        return;
    };
    let ns = unique_namespace("evict");
    let err = connect(&server.url(), &ns).await.unwrap_err();
    assert_misconfigured(&err, "maxmemory-policy");
    assert!(err.to_string().contains("allkeys-lru"), "{err}");
    let opted_in = connect(&format!("{}?volatile=true", server.url()), &ns)
        .await
        .unwrap();
    let shown = opted_in.to_string();
    assert!(
        shown.contains("volatile") && shown.contains("maxmemory-policy allkeys-lru"),
        "{shown}"
    );
    say(&format!("eviction allkeys-lru: refused: {err}"));

    for policy in ["allkeys-lfu", "allkeys-random"] {
        server
            .command(&["CONFIG", "SET", "maxmemory-policy", policy])
            .unwrap();
        let err = connect(&server.url(), &ns).await.unwrap_err();
        assert_misconfigured(&err, "maxmemory-policy");
    }
    for policy in ["noeviction", "volatile-lru"] {
        server
            .command(&["CONFIG", "SET", "maxmemory-policy", policy])
            .unwrap();
        let store = connect(&server.url(), &ns)
            .await
            .unwrap_or_else(|e| panic!("{policy} is safe: {e}"));
        assert!(store.accepted_risks().is_empty(), "{policy}: {store}");
        let r = run(policy);
        store.create(&r).await.unwrap();
        assert_eq!(
            store
                .claim(&r, &worker("w"), ttl(1_000))
                .await
                .unwrap()
                .fence()
                .get(),
            1
        );
    }
}

/// `appendfsync everysec` is refused, naming the setting, with or without replica
/// acknowledgement (a primary that restarts before a failover is declared comes back without
/// its unsynced tail, and its replicas resync from it); accepted only with `volatile=true`,
/// and `Display` says so.
#[tokio::test]
async fn appendfsync_everysec_is_refused_even_with_replicas_unless_volatile() {
    let Some(server) = server(RedisOptions::default().with_appendfsync("everysec")) else {
        return;
    };
    let ns = unique_namespace("everysec");
    let err = connect(&server.url(), &ns).await.unwrap_err();
    assert_misconfigured(&err, "appendfsync");
    assert!(err.to_string().contains("everysec"), "{err}");
    say(&format!("appendfsync everysec: refused: {err}"));

    let err = connect(
        &format!("{}?replicas=1&replica_timeout_ms=100", server.url()),
        &ns,
    )
    .await
    .unwrap_err();
    assert_misconfigured(&err, "appendfsync always");
    say(&format!(
        "appendfsync everysec with replicas=1: refused: {err}"
    ));

    let store = connect(&format!("{}?volatile=true", server.url()), &ns)
        .await
        .unwrap();
    let shown = store.to_string();
    assert!(
        shown.contains("volatile") && shown.contains("appendfsync everysec"),
        "{shown}"
    );
    assert_eq!(store.accepted_risks(), ["appendfsync everysec"]);
    say(&format!("appendfsync everysec with volatile=true: {shown}"));
}

/// `no-appendfsync-on-rewrite yes` (Redis skips fsync while it rewrites the append-only
/// file) is refused under `appendfsync always`, naming the setting; accepted with
/// `volatile=true` and shown.
#[tokio::test]
async fn no_appendfsync_on_rewrite_is_refused_unless_volatile() {
    let Some(unsafe_server) =
        server(RedisOptions::default().with_args(&["--no-appendfsync-on-rewrite", "yes"]))
    else {
        return;
    };
    let ns = unique_namespace("rewrite");
    let err = connect(&unsafe_server.url(), &ns).await.unwrap_err();
    assert_misconfigured(&err, "no-appendfsync-on-rewrite");
    say(&format!("no-appendfsync-on-rewrite yes: refused: {err}"));
    let store = connect(&format!("{}?volatile=true", unsafe_server.url()), &ns)
        .await
        .unwrap();
    assert_eq!(store.accepted_risks(), ["no-appendfsync-on-rewrite yes"]);
    assert!(
        store.to_string().contains("no-appendfsync-on-rewrite"),
        "{store}"
    );
    // The server the fixture starts by default passes.
    let Some(safe) = server(RedisOptions::default()) else {
        return;
    };
    let store = connect(&safe.url(), &ns).await.unwrap();
    assert!(store.accepted_risks().is_empty(), "{store}");
}

/// Size of the live append-only file.
fn aof_size(server: &lease_conformance::fixtures::RedisServer) -> u64 {
    let file = server.aof_incr_file().expect("an append-only file");
    std::fs::metadata(&file).unwrap().len()
}

/// Waits until the server's append-only buffer is empty: every write it has acknowledged is in
/// the file (not necessarily on the disk).
async fn written(server: &lease_conformance::fixtures::RedisServer) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pending = server.info("persistence", "aof_buffer_length").unwrap();
        if pending == "0" {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the append-only buffer still holds {pending} bytes after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An OS crash simulated by cutting the append-only file back to an earlier size: under
/// `appendfsync everysec` (accepted only with `volatile=true`) writes past the last fsync can
/// be lost, and the restarted server issues a fence again; the test asserts the repeat, so it
/// is known to see the loss.
#[tokio::test]
async fn under_everysec_an_os_crash_loses_claims_and_a_fence_repeats() {
    let Some(mut server) = server(RedisOptions::default().with_appendfsync("everysec")) else {
        return;
    };
    let ns = unique_namespace("crash");
    let url = format!("{}?volatile=true", server.url());
    let store = connect(&url, &ns).await.unwrap();
    let r = run("r");
    store.create(&r).await.unwrap();
    let first = store.claim(&r, &worker("a"), ttl(60_000)).await.unwrap();
    store.release(&first).await.unwrap();
    // Everything so far reached the file: the "last fsync". Under everysec a reply can go out
    // while its write waits in the server's buffer (up to 2 s while a background fsync is
    // slow), so the file's size alone does not say that; an empty buffer does.
    written(&server).await;
    let synced = aof_size(&server);
    let mut lost = Vec::new();
    for name in ["b", "c", "d"] {
        let lease = store.claim(&r, &worker(name), ttl(60_000)).await.unwrap();
        lost.push(lease.fence().get());
        store.release(&lease).await.unwrap();
    }
    written(&server).await;
    assert!(
        aof_size(&server) > synced,
        "the later claims never reached the file"
    );
    server.stop(); // SIGKILL
    let file = server.aof_incr_file().unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(synced)
        .unwrap();
    server.restart().unwrap();

    let after = connect(&url, &ns).await.unwrap();
    let again = after
        .claim(&r, &worker("e"), ttl(60_000))
        .await
        .unwrap_or_else(|e| panic!("the claim after the restart was refused: {e:?}"));
    say(&format!(
        "everysec OS crash: fences {} then {lost:?} were handed out; after the AOF lost its \
         tail the restarted server handed out fence {} again",
        first.fence(),
        again.fence()
    ));
    let handed_out: Vec<u64> = std::iter::once(first.fence().get()).chain(lost).collect();
    assert!(
        handed_out.contains(&again.fence().get()),
        "fence {} after the crash should repeat one of {handed_out:?}",
        again.fence()
    );
}

/// Under `appendfsync always` every acknowledged claim is on disk before its reply: the file
/// grows with each one, a crash right after loses none of them, and every fence after the
/// restart is above every fence before.
#[tokio::test]
async fn under_always_an_os_crash_loses_no_acknowledged_claim() {
    let Some(mut server) = server(RedisOptions::default()) else {
        return;
    };
    let ns = unique_namespace("always");
    let store = connect(&server.url(), &ns).await.unwrap();
    let r = run("r");
    store.create(&r).await.unwrap();
    let mut before = Vec::new();
    let mut size = aof_size(&server);
    for name in ["a", "b", "c", "d"] {
        let lease = store.claim(&r, &worker(name), ttl(60_000)).await.unwrap();
        assert!(
            aof_size(&server) > size,
            "claim {} was acknowledged before it reached the file",
            lease.fence()
        );
        before.push(lease.fence().get());
        store.release(&lease).await.unwrap();
        size = aof_size(&server);
    }
    // The OS crash: the disk keeps what was synced when the last reply was sent.
    let synced = aof_size(&server);
    server.stop(); // SIGKILL
    let file = server.aof_incr_file().unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(synced)
        .unwrap();
    server.restart().unwrap();

    let after = connect(&server.url(), &ns).await.unwrap();
    let mut later = Vec::new();
    for name in ["e", "f"] {
        let lease = after.claim(&r, &worker(name), ttl(60_000)).await.unwrap();
        later.push(lease.fence().get());
        after.release(&lease).await.unwrap();
    }
    say(&format!(
        "appendfsync always crash: fences before {before:?}, after {later:?}"
    ));
    let highest = before.iter().max().unwrap();
    assert!(
        later.iter().all(|f| f > highest),
        "{later:?} after {before:?}"
    );
}

/// With `CONFIG` renamed away (as managed services do) the guard cannot read the settings:
/// refused, naming `CONFIG`; accepted with `volatile=true`, and `Display` shows the opt-in.
#[tokio::test]
async fn a_renamed_config_command_is_refused_unless_volatile() {
    let Some(server) = server(RedisOptions::default().with_config_renamed("")) else {
        return;
    };
    let ns = unique_namespace("noconfig");
    let err = connect(&server.url(), &ns).await.unwrap_err();
    assert_misconfigured(&err, "CONFIG");
    say(&format!("CONFIG renamed away: refused: {err}"));
    let store = connect(&format!("{}?volatile=true", server.url()), &ns)
        .await
        .unwrap();
    let shown = store.to_string();
    assert!(
        shown.contains("volatile") && shown.contains("CONFIG"),
        "{shown}"
    );
    say(&format!("CONFIG renamed away with volatile=true: {shown}"));
    let r = run("r");
    store.create(&r).await.unwrap();
    store.claim(&r, &worker("w"), ttl(1_000)).await.unwrap();

    // Renamed to a secret name is the same: the adapter cannot know it.
    let Some(secret) = super::server(RedisOptions::default().with_config_renamed("CONFIG_9f2c"))
    else {
        return;
    };
    let err = connect(&secret.url(), &ns).await.unwrap_err();
    assert_misconfigured(&err, "CONFIG");
}

/// A server restarted on the same port and directory with AOF off, under a running store:
/// the store's next operations fail with the durability error (`Misconfigured`, naming
/// `appendonly`), and a scope renewing through it is cancelled with that rejection at once,
/// long before its local deadline.
#[tokio::test]
async fn a_server_restarted_without_aof_stops_a_running_store_and_its_scope() {
    let Some(mut server) = server(RedisOptions::default()) else {
        return;
    };
    let ns = unique_namespace("reconnect");
    let store: Arc<RedisLeaseStore> = Arc::new(
        RedisLeaseStore::connect(config(&server.url(), &ns))
            .await
            .unwrap(),
    );
    let (held, scoped) = (run("held"), run("scoped"));
    store.create(&held).await.unwrap();
    store.create(&scoped).await.unwrap();
    let lease = store.claim(&held, &worker("a"), ttl(10_000)).await.unwrap();
    let scope = RunScope::claim(
        store.clone(),
        &scoped,
        &worker("a"),
        ttl(10_000),
        ScopeConfig::default().with_heartbeat(Duration::from_millis(100)),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(
        scope.renewals() >= 1,
        "the scope heartbeats before the restart"
    );
    let deadline = scope.deadline();

    *server.options_mut() = RedisOptions::default().with_appendonly(false);
    server.restart().unwrap();
    let restarted = tokio::time::Instant::now();

    let (at, reason) = tokio::time::timeout(Duration::from_secs(3), async {
        scope.cancelled().await;
        scope.cancel_reason().unwrap()
    })
    .await
    .unwrap_or_else(|_| panic!("the scope kept running on an unsafe server: {scope:?}"));
    match &reason {
        CancelReason::Rejected(err) => assert_misconfigured(err, "appendonly"),
        other => panic!("expected the durability error as the reason, got {other}"),
    }
    assert!(
        deadline - at > Duration::from_secs(5),
        "cancelled {:?} after the restart, {:?} before its local deadline",
        at - restarted,
        deadline - at
    );
    let err = store.renew(&lease).await.unwrap_err();
    assert_misconfigured(&err, "appendonly");
    let err = store.append(&lease, b"x").await.unwrap_err();
    assert_misconfigured(&err, "appendonly");
    say(&format!(
        "restart without AOF: scope cancelled {:?} after the restart: {reason}",
        at - restarted
    ));
    assert!(matches!(err, Error::Misconfigured { .. }));
}

/// A plain `redis://` master with a replica attached and `replicas=0` is refused at connect,
/// naming `replicas=N` and the narrow opt-in, because a promoted replica would lack the last
/// claims; `async_replicas=accept` accepts exactly that (shown by `Display` and
/// `accepted_risks`, without `volatile:`), `replicas=1` needs no opt-in, and a replica attached
/// to a master a store already uses is refused on the store's next new connection.
#[tokio::test]
async fn attached_replicas_without_acknowledgements_are_refused_unless_accepted() {
    let Some(primary) = server(RedisOptions::default()) else {
        return;
    };
    let ns = unique_namespace("attached");
    // No replica yet: accepted, nothing risky.
    let early = connect(&primary.url(), &ns).await.unwrap();
    assert!(early.accepted_risks().is_empty(), "{early}");
    let Some(replica) = server(RedisOptions::default().with_replicaof(primary.port())) else {
        return;
    };
    replica
        .wait_synced_to(&primary, Duration::from_secs(10))
        .unwrap();

    let err = connect(&primary.url(), &ns).await.unwrap_err();
    assert_misconfigured(&err, "connected_slaves");
    let shown = err.to_string();
    assert!(
        shown.contains("1 replica(s)")
            && shown.contains("replicas=N")
            && shown.contains("async_replicas=accept"),
        "{shown}"
    );
    let accepted = connect(&format!("{}?async_replicas=accept", primary.url()), &ns)
        .await
        .unwrap();
    assert_eq!(
        accepted.accepted_risks(),
        ["replicas without replicas=N".to_owned()]
    );
    let display = accepted.to_string();
    assert!(
        display.contains("[accepts replicas without replicas=N") && !display.contains("volatile"),
        "{display}"
    );
    let acknowledged = connect(&format!("{}?replicas=1", primary.url()), &ns)
        .await
        .unwrap();
    assert!(acknowledged.accepted_risks().is_empty(), "{acknowledged}");

    // The store connected before the replica came: its next new connection is checked too.
    primary
        .command(&["CLIENT", "KILL", "TYPE", "normal"])
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let later = loop {
        match early.create(&run("after")).await {
            Err(e) if e.to_string().contains("connected_slaves") => break e,
            Err(e) if Instant::now() < deadline => {
                say(&format!("waiting for the reconnect's check: {e}"));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => panic!("a replica attached under a running store went unnoticed: {other:?}"),
        }
    };
    say(&format!("replica attached, replicas=0: {later}"));
}
