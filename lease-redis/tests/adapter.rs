//! Adapter tests: what the conformance suite cannot see from the trait (key layout, secrets,
//! connection loss, restarts, the durability guard, fenced scripts), on private redis-servers.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lease_conformance::assert_unavailable;
use lease_conformance::fixtures::{unavailable, unique_namespace, RedisOptions, RedisServer};
use lease_core::{
    End, Ended, Ending, Error, Fence, Lease, LeaseStore, ListFilter, RunId, RunState, Ttl, WorkerId,
};
use lease_redis::{FencedScript, RedisConfig, RedisLeaseStore};

const HINT: &str = "install redis-server (apt-get install redis-server)";

/// A private server, or `None` outside CI when redis-server is missing.
fn server(appendonly: bool, password: Option<&str>) -> Option<RedisServer> {
    match RedisServer::start_with(appendonly, password) {
        Ok(server) => Some(server),
        Err(why) => unavailable("redis-server", why, HINT),
    }
}

async fn connect(url: &str, namespace: &str) -> RedisLeaseStore {
    let config = RedisConfig::from_url(url)
        .with_namespace(namespace)
        .with_response_timeout(Duration::from_millis(500))
        .with_connect_timeout(Duration::from_millis(500));
    RedisLeaseStore::connect(config).await.expect("connect")
}

async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection_with_config(
            // A server busy with an fsync must not fail the test's own reads (the default is 500 ms).
            &redis::AsyncConnectionConfig::new()
                .set_response_timeout(Some(std::time::Duration::from_secs(30))),
        )
        .await
        .unwrap()
}

fn run(id: &str) -> RunId {
    RunId::new(id).unwrap()
}

fn worker(id: &str) -> WorkerId {
    WorkerId::new(id).unwrap()
}

fn ttl(ms: u64) -> Ttl {
    Ttl::from_millis(ms).unwrap()
}

#[tokio::test]
async fn hostile_run_ids_round_trip_without_colliding_or_leaving_the_slot() {
    let Some(server) = server(true, None) else {
        return;
    };
    let ns = unique_namespace("hostile");
    let store = connect(&server.url(), &ns).await;
    let long = "€".repeat(85); // 255 bytes
    let ids = [
        "a",
        "61",
        "a:b",
        "a:",
        ":b",
        "a}b",
        "{a}",
        "}{",
        "{lease:x}",
        "a b",
        " ",
        "ä",
        "𝄞",
        long.as_str(),
        "r:61",
        "j:61",
    ];
    for id in ids {
        store.create(&run(id)).await.unwrap();
    }
    for id in ids {
        let lease = store
            .claim(&run(id), &worker("w"), ttl(60_000))
            .await
            .unwrap();
        assert_eq!(
            lease.fence().get(),
            1,
            "{id:?} shares a fence with another id"
        );
        store.append(&lease, id.as_bytes()).await.unwrap();
    }
    for id in ids {
        let journal = store.journal(&run(id)).await.unwrap();
        assert_eq!(journal.len(), 1, "{id:?}");
        assert_eq!(journal[0].payload, id.as_bytes(), "{id:?}");
        assert_eq!(store.inspect(&run(id)).await.unwrap().run.as_str(), id);
    }
    let listed: Vec<String> = store
        .list(&ListFilter::default())
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.run.as_str().to_owned())
        .collect();
    let mut expected: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
    expected.sort();
    assert_eq!(listed, expected);

    // Every key of the namespace carries its hash tag, and nothing else in the key has braces.
    let mut conn = raw(&server.url()).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    let tag = format!("{{lease:{ns}}}:");
    // The runs hash, the id index, the claimable index, the counter, and a journal per run.
    assert!(keys.len() >= ids.len() + 4, "{keys:?}");
    for key in &keys {
        assert!(key.starts_with(&tag), "{key}");
        assert!(!key[tag.len()..].contains(['{', '}']), "{key}");
    }
}

/// Collects every tracing event's text, one line an event.
struct Capture(Arc<Mutex<String>>);

/// Everything logged in this test process from the first call on: the capture is the global
/// default. A thread-local default (`set_default`) can miss events when tests run in parallel:
/// tracing caches each call site's interest for all threads, and another test's thread can
/// register a call site while the cache is rebuilt for the new subscriber. So every test reads
/// the whole process's log, and looks for its own server in it.
fn captured() -> Arc<Mutex<String>> {
    static LOG: std::sync::OnceLock<Arc<Mutex<String>>> = std::sync::OnceLock::new();
    LOG.get_or_init(|| {
        let log = Arc::new(Mutex::new(String::new()));
        tracing::subscriber::set_global_default(Capture(log.clone()))
            .expect("no other subscriber in this test process");
        log
    })
    .clone()
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        struct Text<'a>(&'a mut String);
        impl tracing::field::Visit for Text<'_> {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0.push_str(&format!("{}={value:?} ", field.name()));
            }
        }
        let mut log = self.0.lock().unwrap();
        event.record(&mut Text(&mut log));
        log.push('\n');
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[tokio::test]
async fn the_password_never_appears_in_errors_logs_or_debug() {
    const PASSWORD: &str = "pw-Zq8sWx3";
    const WRONG: &str = "pw-Wrong77";
    let Some(mut server) = server(false, Some(PASSWORD)) else {
        return;
    };
    let log = captured();
    let mut shown = Vec::new();

    // Volatile on purpose: the guard's warning names the server, and must not name the secret.
    let url = format!("{}?volatile=true", server.url());
    let config = RedisConfig::from_url(&url).with_response_timeout(Duration::from_millis(500));
    shown.push(format!("{config:?} {config}"));
    let store = RedisLeaseStore::connect(config).await.unwrap();
    shown.push(format!("{store:?} {store}"));

    let wrong = RedisLeaseStore::from_url(&url.replace(PASSWORD, WRONG))
        .await
        .unwrap_err();
    assert!(!wrong.is_retryable(), "{wrong}");
    shown.push(format!("{wrong} {wrong:?}"));

    // Without AOF and without opting in, the guard's refusal must not leak it either.
    let refused = RedisLeaseStore::from_url(&server.url()).await.unwrap_err();
    shown.push(format!("{refused} {refused:?}"));

    server.stop();
    let down = store.inspect(&run("r")).await.unwrap_err();
    assert!(down.is_retryable(), "{down}");
    shown.push(format!("{down} {down:?}"));
    let unreachable = RedisLeaseStore::from_url(&url).await.unwrap_err();
    shown.push(format!("{unreachable} {unreachable:?}"));

    let port = server.port().to_string();
    let logged = log.lock().unwrap().clone();
    assert!(
        logged
            .lines()
            .any(|line| line.contains("volatile") && line.contains(&port)),
        "the guard did not log"
    );
    shown.push(logged);
    for text in shown {
        assert!(!text.contains(PASSWORD), "password leaked: {text}");
        assert!(!text.contains(WRONG), "wrong password leaked: {text}");
    }
}

#[tokio::test]
async fn connection_loss_gives_retryable_errors_then_recovers_after_restart() {
    let Some(mut server) = server(true, None) else {
        return;
    };
    let store = connect(&server.url(), &unique_namespace("loss")).await;
    let r = run("r");
    store.create(&r).await.unwrap();
    let lease = store.claim(&r, &worker("a"), ttl(60_000)).await.unwrap();

    server.stop();
    for _ in 0..3 {
        let started = Instant::now();
        let err = store.renew(&lease).await.unwrap_err();
        assert_unavailable(&err, "redis");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "took {:?}",
            started.elapsed()
        );
    }

    server.restart().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let renewed = loop {
        match store.renew(&lease).await {
            Ok(renewed) => break renewed,
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("no recovery after restart: {e}"),
        }
    };
    assert_eq!(renewed.fence(), lease.fence());
    assert_eq!(store.inspect(&r).await.unwrap().heartbeats, 1);
}

#[tokio::test]
async fn a_hung_server_gives_retryable_errors_not_hangs() {
    let Some(server) = server(true, None) else {
        return;
    };
    let store = connect(&server.url(), &unique_namespace("hang")).await;
    store.create(&run("r")).await.unwrap();
    let pid = server.pid().unwrap().to_string();
    let signal = |sig: &str| {
        assert!(std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success())
    };
    signal("-STOP");
    let started = Instant::now();
    let err = store.inspect(&run("r")).await.unwrap_err();
    let took = started.elapsed();
    signal("-CONT");
    assert!(err.is_retryable(), "{err:?}");
    assert!(took < Duration::from_secs(3), "took {took:?}");
}

#[tokio::test]
async fn after_a_crash_and_restart_with_aof_fences_only_move_forward() {
    let Some(mut server) = server(true, None) else {
        return;
    };
    let ns = unique_namespace("durable");
    let store = connect(&server.url(), &ns).await;
    let r = run("r");
    store.create(&r).await.unwrap();
    let mut issued = Vec::new();
    for i in 0..5 {
        let lease = store.claim(&r, &worker("a"), ttl(1)).await.unwrap();
        if i == 4 {
            store.append(&lease, b"before the crash").await.unwrap();
        }
        issued.push(lease.fence().get());
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let highest = *issued.iter().max().unwrap();

    server.stop(); // SIGKILL: no shutdown save; only the AOF survives
    server.restart().unwrap();

    // A new store connects; the old one recovers through its reconnecting connection.
    let fresh = connect(&server.url(), &ns).await;
    let next = fresh.claim(&r, &worker("b"), ttl(60_000)).await.unwrap();
    assert!(
        next.fence().get() > highest,
        "{} after {issued:?}",
        next.fence()
    );
    assert_eq!(
        fresh.journal(&r).await.unwrap()[0].payload,
        b"before the crash"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let seen = loop {
        match store.inspect(&r).await {
            Ok(record) => break record,
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("old store did not recover: {e}"),
        }
    };
    assert_eq!(seen.fence, next.fence());
}

/// Tests that make the guard's volatile-mode warning take turns: a thread-local capture of
/// that warning can miss it while another test thread, with no subscriber, hits the same
/// callsite (tracing caches a callsite's interest process-wide).
static VOLATILE_WARNING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn the_durability_guard_refuses_a_server_without_persistence_unless_opted_in() {
    let _one_at_a_time = VOLATILE_WARNING.lock().await;
    let Some(server) = server(false, None) else {
        return;
    };
    let err = RedisLeaseStore::from_url(&server.url()).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Misconfigured {
                backend: "redis",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(!err.is_retryable());
    let text = err.to_string();
    assert!(
        text.contains("appendonly no") && text.contains("volatile=true"),
        "{text}"
    );
    assert!(
        text.contains("issue a fence an old holder still carries"),
        "{text}"
    );

    let store = RedisLeaseStore::from_url(&format!("{}?volatile=true", server.url()))
        .await
        .unwrap();
    store.create(&run("r")).await.unwrap();
    let store = RedisLeaseStore::connect(RedisConfig::from_url(server.url()).with_volatile(true))
        .await
        .unwrap();
    assert!(store.inspect(&run("r")).await.is_ok());
}

#[tokio::test]
async fn when_config_is_not_permitted_the_guard_refuses_unless_volatile() {
    let _one_at_a_time = VOLATILE_WARNING.lock().await;
    let Some(server) = server(true, None) else {
        return;
    };
    let mut conn = raw(&server.url()).await;
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "app", "on", ">app-pw", "~*", "+@all", "-config"])
        .query_async(&mut conn)
        .await
        .unwrap();
    let log = captured();
    let url = format!("redis://app:app-pw@127.0.0.1:{}", server.port());
    let err = RedisLeaseStore::from_url(&url).await.unwrap_err();
    assert!(matches!(err, Error::Misconfigured { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("CONFIG GET is not permitted"), "{text}");
    assert!(!text.contains("app-pw"), "{text}");
    let store = RedisLeaseStore::from_url(&format!("{url}?volatile=true"))
        .await
        .unwrap();
    store.create(&run("r")).await.unwrap();
    let shown = store.to_string();
    assert!(
        shown.contains("volatile: accepts CONFIG unreadable"),
        "{shown}"
    );
    assert!(!shown.contains("app-pw"), "{shown}");
    let log = log.lock().unwrap().clone();
    let port = server.port().to_string();
    assert!(
        log.lines().any(|line| line.contains("volatile mode")
            && line.contains("CONFIG unreadable")
            && line.contains(&port)),
        "{log}"
    );
    assert!(!log.contains("app-pw"), "{log}");
}

#[tokio::test]
async fn a_fenced_script_runs_only_under_the_current_fence() {
    let Some(server) = server(true, None) else {
        return;
    };
    let store = connect(&server.url(), &unique_namespace("fenced")).await;
    let r = run("order:{42}");
    store.create(&r).await.unwrap();
    let outbox = store.script_key(&r, "outbox");
    let push = FencedScript::new("return redis.call('RPUSH', KEYS[1], ARGV[1])");
    let mut conn = raw(&server.url()).await;

    let a = store.claim(&r, &worker("a"), ttl(20)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(40)).await;
    let b = store.claim(&r, &worker("b"), ttl(60_000)).await.unwrap();

    let err = store
        .fenced_script::<i64, _, _>(&a, &push, &[&outbox], &["from a"])
        .await
        .unwrap_err();
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
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&outbox)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(exists, 0, "a stale write left something behind");

    let len: i64 = store
        .fenced_script(&b, &push, &[&outbox], &["from b"])
        .await
        .unwrap();
    assert_eq!(len, 1);
    let items: Vec<String> = redis::cmd("LRANGE")
        .arg(&outbox)
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(items, ["from b"]);

    // After release, the current fence no longer writes either; keys outside the slot are refused.
    store.release(&b).await.unwrap();
    let err = store
        .fenced_script::<i64, _, _>(&b, &push, &[&outbox], &["late"])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::LeaseEnded {
                fence: 2,
                ended: Ended::Released,
                ..
            }
        ),
        "{err:?}"
    );
    let c = store.claim(&r, &worker("c"), ttl(60_000)).await.unwrap();
    let err = store
        .fenced_script::<i64, _, _>(&c, &push, &["elsewhere"], &["x"])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Misconfigured { .. }), "{err:?}");
    let missing = store
        .fenced_script::<i64, _, _>(&c, &push, &[&outbox], &["from c"])
        .await
        .unwrap();
    assert_eq!(missing, 2);
    assert_ne!(
        store.script_key(&r, "outbox"),
        store.script_key(&run("order:{43}"), "outbox")
    );
}

#[tokio::test]
async fn stores_in_different_namespaces_do_not_see_each_other() {
    let Some(server) = server(true, None) else {
        return;
    };
    let one = connect(&server.url(), &unique_namespace("one")).await;
    let two = connect(&server.url(), &unique_namespace("two")).await;
    one.create(&run("r")).await.unwrap();
    assert!(matches!(
        two.inspect(&run("r")).await,
        Err(Error::NotFound { .. })
    ));
    assert!(two
        .claim_next(&worker("w"), ttl(1000), 10)
        .await
        .unwrap()
        .is_empty());
    let bad = RedisLeaseStore::connect(RedisConfig::from_url(server.url()).with_namespace("a}b"))
        .await
        .unwrap_err();
    assert!(matches!(bad, Error::Misconfigured { .. }), "{bad:?}");
}

#[tokio::test]
async fn a_run_at_the_last_fence_is_exhausted_and_skipped_by_claim_next() {
    let Some(server) = server(true, None) else {
        return;
    };
    let ns = unique_namespace("exhausted");
    let store = connect(&server.url(), &ns).await;
    let (last, other) = (run("last"), run("other"));
    store.create(&last).await.unwrap();
    store.create(&other).await.unwrap();
    let lease = store.claim(&last, &worker("a"), ttl(60_000)).await.unwrap();
    store.release(&lease).await.unwrap();
    // No API reaches i64::MAX claims; set it directly, as 2^63 - 1 claims would have.
    let max = i64::MAX.to_string();
    // The record is 'state:fence:heartbeats:expiry:member:owner' in the namespace's runs hash.
    let key = format!("{{lease:{ns}}}:runs");
    let field = "6c617374"; // hex("last")
    let mut conn = raw(&server.url()).await;
    let record = raw_record(&mut conn, &key, field).await;
    let mut parts: Vec<&str> = record.splitn(6, ':').collect();
    parts[1] = &max;
    set_raw_record(&mut conn, &key, field, &parts.join(":")).await;

    let err = store
        .claim(&last, &worker("b"), ttl(60_000))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::FenceExhausted { ref run } if *run == last),
        "{err:?}"
    );
    let claimed = store
        .claim_next(&worker("b"), ttl(60_000), 10)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1, "{claimed:?}");
    assert_eq!(claimed[0].run(), &other);
    // Fences near i64::MAX stay exact: the old lease is stale against the full value.
    let err = store.append(&lease, b"x").await.unwrap_err();
    assert!(
        matches!(err, Error::StaleFence { presented: 1, current, .. } if current == i64::MAX as u64),
        "{err:?}"
    );
    assert_eq!(
        store.inspect(&last).await.unwrap().fence.get(),
        i64::MAX as u64
    );
}

/// A record written before the adapter kept times ('state:fence:heartbeats:expiry:member:owner',
/// nothing after the owner) reads with no times and an exact owner, even one holding ':' and
/// digits; its next claim and renewal add theirs, and its owner still reads exactly.
#[tokio::test]
async fn a_record_written_before_times_reads_without_them_and_gains_them() {
    let Some(server) = server(true, None) else {
        return;
    };
    let ns = unique_namespace("old-record");
    let store = connect(&server.url(), &ns).await;
    let old = run("old");
    let holder = worker("w:1,2,3");
    store.create(&old).await.unwrap();
    let first = store.claim(&old, &holder, ttl(60_000)).await.unwrap();
    let key = format!("{{lease:{ns}}}:runs");
    let field = "6f6c64"; // hex("old")
    let mut conn = raw(&server.url()).await;
    let record = raw_record(&mut conn, &key, field).await;
    let (before, times) = record
        .split_once('\u{1}')
        .unwrap_or_else(|| panic!("a record with times: {record:?}"));
    assert!(before.ends_with(":w:1,2,3"), "{record:?}");
    assert_eq!(
        times.split(',').count(),
        3,
        "created,claimed,renewed: {times:?}"
    );
    set_raw_record(&mut conn, &key, field, before).await;

    let read = store.inspect(&old).await.unwrap();
    assert_eq!(read.owner, Some(holder.clone()), "{read:?}");
    assert_eq!(
        [
            read.created_at,
            read.claimed_at,
            read.renewed_at,
            read.ended_at
        ],
        [None; 4],
        "{read:?}"
    );
    assert!(!read.times_kept());
    store.renew(&first).await.unwrap();
    let renewed = store.inspect(&old).await.unwrap();
    assert!(renewed.renewed_at.is_some(), "{renewed:?}");
    assert_eq!(renewed.owner, Some(holder.clone()));
    store.release(&first).await.unwrap();
    let second = store.claim(&old, &holder, ttl(60_000)).await.unwrap();
    let claimed = store.inspect(&old).await.unwrap();
    assert!(claimed.claimed_at.is_some(), "{claimed:?}");
    assert_eq!(
        claimed.renewed_at, None,
        "a claim clears the renewal: {claimed:?}"
    );
    assert_eq!(claimed.created_at, None, "the creation time stays unknown");
    assert_eq!(claimed.owner, Some(holder));
    store.complete(&second).await.unwrap();
    let done = store.inspect(&old).await.unwrap();
    assert!(done.ended_at >= claimed.claimed_at, "{done:?}");
}

/// The run record stored in the runs hash `key` under `field` (the encoded id), as is.
async fn raw_record(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    field: &str,
) -> String {
    redis::cmd("HGET")
        .arg(key)
        .arg(field)
        .query_async(conn)
        .await
        .unwrap()
}

/// Overwrites the run record in the runs hash `key` under `field` with `value`.
async fn set_raw_record(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    field: &str,
    value: &str,
) {
    let _: () = redis::cmd("HSET")
        .arg(key)
        .arg(field)
        .arg(value)
        .query_async(conn)
        .await
        .unwrap();
}

/// The raw journal list of `id` in namespace `ns` (the adapter's key layout).
async fn journal_len(conn: &mut redis::aio::MultiplexedConnection, ns: &str, id: &str) -> i64 {
    let hex: String = id.bytes().map(|b| format!("{b:02x}")).collect();
    redis::cmd("LLEN")
        .arg(format!("{{lease:{ns}}}:j:{hex}"))
        .query_async(conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_complete_with_under_a_stale_fence_journals_nothing_and_changes_nothing() {
    let Some(server) = server(true, None) else {
        return;
    };
    let ns = unique_namespace("stalewith");
    let store = connect(&server.url(), &ns).await;
    let r = run("r");
    store.create(&r).await.unwrap();
    let a = store.claim(&r, &worker("a"), ttl(20)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(40)).await;
    let b = store.claim(&r, &worker("b"), ttl(60_000)).await.unwrap();
    let before = store.inspect(&r).await.unwrap();

    let results = store
        .end_many(&[Ending::new(a, End::CompleteWith(b"charged twice".to_vec()))])
        .await
        .unwrap();
    assert!(
        matches!(
            results[..],
            [Err(Error::StaleFence {
                presented: 1,
                current: 2,
                ..
            })]
        ),
        "{results:?}"
    );
    let mut conn = raw(&server.url()).await;
    assert_eq!(
        journal_len(&mut conn, &ns, "r").await,
        0,
        "a stale effect was journaled"
    );
    assert!(store.journal(&r).await.unwrap().is_empty());
    let after = store.inspect(&r).await.unwrap();
    assert_eq!(
        (
            after.state,
            &after.owner,
            after.expires_at,
            after.fence,
            after.heartbeats
        ),
        (
            before.state,
            &before.owner,
            before.expires_at,
            before.fence,
            before.heartbeats
        )
    );
    // The holder's own complete-with still lands, effect and completion together.
    let results = store
        .end_many(&[Ending::new(
            b.clone(),
            End::CompleteWith(b"charged".to_vec()),
        )])
        .await
        .unwrap();
    assert!(matches!(results[..], [Ok(())]), "{results:?}");
    let journal = store.journal(&r).await.unwrap();
    assert_eq!(journal.len(), 1);
    assert_eq!(
        (journal[0].fence, &journal[0].payload[..]),
        (b.fence(), &b"charged"[..])
    );
    assert_eq!(store.inspect(&r).await.unwrap().state, RunState::Completed);
}

#[tokio::test]
async fn a_mixed_end_many_batch_gives_each_item_its_own_verdict() {
    let Some(server) = server(true, None) else {
        return;
    };
    let ns = unique_namespace("mixed");
    let store = connect(&server.url(), &ns).await;
    let ids = ["done", "with", "back", "wait", "stale", "ahead"];
    for id in ids {
        store.create(&run(id)).await.unwrap();
    }
    let mut leases = Vec::new();
    for id in ids {
        leases.push(
            store
                .claim(&run(id), &worker("a"), ttl(60_000))
                .await
                .unwrap(),
        );
    }
    // "stale": expire a's lease (force-release) and let b take it under fence 2.
    store.force_release(&run("stale")).await.unwrap();
    let b = store
        .claim(&run("stale"), &worker("b"), ttl(60_000))
        .await
        .unwrap();
    let forged = |lease: &Lease, fence: u64| {
        Lease::new(
            lease.run().clone(),
            lease.owner().clone(),
            Fence::new(fence).unwrap(),
            lease.ttl(),
            lease.expires_at(),
        )
        .unwrap()
    };
    let missing = Lease::new(
        run("never-created"),
        worker("a"),
        Fence::new(1).unwrap(),
        ttl(60_000),
        leases[0].expires_at(),
    )
    .unwrap();
    let batch = vec![
        Ending::new(leases[0].clone(), End::Complete),
        Ending::new(leases[1].clone(), End::CompleteWith(b"effect".to_vec())),
        Ending::new(leases[2].clone(), End::Release),
        Ending::new(leases[3].clone(), End::Suspend),
        Ending::new(
            leases[4].clone(),
            End::CompleteWith(b"stale effect".to_vec()),
        ),
        Ending::new(forged(&leases[5], 7), End::Complete),
        Ending::new(missing, End::Release),
    ];
    let results = store.end_many(&batch).await.unwrap();
    assert_eq!(results.len(), batch.len());
    assert!(matches!(results[0], Ok(())), "{:?}", results[0]);
    assert!(matches!(results[1], Ok(())), "{:?}", results[1]);
    assert!(matches!(results[2], Ok(())), "{:?}", results[2]);
    assert!(matches!(results[3], Ok(())), "{:?}", results[3]);
    assert!(
        matches!(
            results[4],
            Err(Error::StaleFence {
                presented: 1,
                current: 2,
                ..
            })
        ),
        "{:?}",
        results[4]
    );
    assert!(
        matches!(
            results[5],
            Err(Error::FenceAhead {
                presented: 7,
                current: 1,
                ..
            })
        ),
        "{:?}",
        results[5]
    );
    assert!(
        matches!(&results[6], Err(Error::NotFound { run }) if run.as_str() == "never-created"),
        "{:?}",
        results[6]
    );

    let state = |id: &'static str| {
        let store = store.clone();
        async move { store.inspect(&run(id)).await.unwrap() }
    };
    assert_eq!(state("done").await.state, RunState::Completed);
    assert_eq!(state("with").await.state, RunState::Completed);
    assert_eq!(state("wait").await.state, RunState::Suspended);
    let back = state("back").await;
    assert_eq!((back.state, back.owner), (RunState::Runnable, None));
    let stale = state("stale").await;
    assert_eq!(
        (stale.owner.as_ref(), stale.fence),
        (Some(b.owner()), b.fence())
    );
    let ahead = state("ahead").await;
    assert_eq!(
        (ahead.owner.as_ref(), ahead.fence.get()),
        (Some(&worker("a")), 1)
    );
    assert!(matches!(
        store.inspect(&run("never-created")).await,
        Err(Error::NotFound { .. })
    ));

    let journal = store.journal(&run("with")).await.unwrap();
    assert_eq!(journal.len(), 1);
    assert_eq!(
        (journal[0].fence.get(), &journal[0].payload[..]),
        (1, &b"effect"[..])
    );
    let mut conn = raw(&server.url()).await;
    assert_eq!(journal_len(&mut conn, &ns, "stale").await, 0);
    // Only the released run is claimable; the ended ones left the claimable index.
    let next = store
        .claim_next(&worker("c"), ttl(60_000), 10)
        .await
        .unwrap();
    assert_eq!(
        next.iter().map(|l| l.run().as_str()).collect::<Vec<_>>(),
        ["back"]
    );
    assert_eq!(next[0].fence().get(), 2);
    let indexed: i64 = redis::cmd("ZCARD")
        .arg(format!("{{lease:{ns}}}:claimable"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(indexed, 3, "back (now held), stale and ahead stay indexed");
}

#[tokio::test]
async fn create_many_refuses_existing_and_repeated_ids_and_keeps_input_order() {
    let Some(server) = server(true, None) else {
        return;
    };
    let store = connect(&server.url(), &unique_namespace("createmany")).await;
    store.create(&run("old")).await.unwrap();
    let batch = ["z", "old", "m", "z", "a", "m"].map(run);
    let results = store.create_many(&batch).await.unwrap();
    let verdicts: Vec<&str> = results
        .iter()
        .map(|r| match r {
            Ok(()) => "created",
            Err(Error::AlreadyExists { .. }) => "exists",
            Err(other) => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        verdicts,
        ["created", "exists", "created", "exists", "created", "exists"]
    );
    for (result, id) in results.iter().zip(&batch) {
        if let Err(Error::AlreadyExists { run }) = result {
            assert_eq!(run, id);
        }
    }
    for id in ["z", "m", "a"] {
        let record = store.inspect(&run(id)).await.unwrap();
        assert_eq!(
            (record.state, record.fence.get(), record.heartbeats),
            (RunState::Runnable, 0, 0)
        );
    }
    // Oldest first, then the batch in input order, not id order.
    let claimed = store
        .claim_next(&worker("w"), ttl(60_000), 10)
        .await
        .unwrap();
    assert_eq!(
        claimed.iter().map(|l| l.run().as_str()).collect::<Vec<_>>(),
        ["old", "z", "m", "a"]
    );
    let listed = store.list(&ListFilter::default()).await.unwrap();
    assert_eq!(
        listed.iter().map(|r| r.run.as_str()).collect::<Vec<_>>(),
        ["a", "m", "old", "z"]
    );
    assert!(store.create_many(&[]).await.unwrap().is_empty());
}

#[tokio::test]
async fn batches_without_replica_acknowledgement_are_unavailable_as_a_whole() {
    let Some(server) = server(true, None) else {
        return;
    };
    let ns = unique_namespace("batchwait");
    let plain = connect(&server.url(), &ns).await;
    plain.create(&run("r")).await.unwrap();
    let lease = plain
        .claim(&run("r"), &worker("a"), ttl(60_000))
        .await
        .unwrap();
    // No replica exists, so WAIT 1 can never be met.
    let url = format!("{}?replicas=1&replica_timeout_ms=50", server.url());
    let waiting = connect(&url, &ns).await;
    let err = waiting
        .end_many(&[Ending::new(lease.clone(), End::Complete)])
        .await
        .unwrap_err();
    assert_unavailable(&err, "redis");
    let err = waiting.create_many(&[run("s")]).await.unwrap_err();
    assert_unavailable(&err, "redis");
    // The retry answers "already ended under your fence": a retrying caller would take that
    // for its commit, so it is withheld like the first answer until replicas hold it.
    let err = waiting
        .end_many(&[Ending::new(lease.clone(), End::Complete)])
        .await
        .unwrap_err();
    assert_unavailable(&err, "redis");
    assert!(err.to_string().contains("replicas"), "{err}");
    let err = waiting.complete(&lease).await.unwrap_err();
    assert_unavailable(&err, "redis");
    // The end was applied on the primary all the same (a failover could lose it).
    let results = plain
        .end_many(&[Ending::new(lease.clone(), End::Complete)])
        .await
        .unwrap();
    assert!(
        matches!(
            results[..],
            [Err(Error::LeaseEnded {
                ended: Ended::Completed,
                ..
            })]
        ),
        "the unacknowledged end was applied on the primary: {results:?}"
    );
    // A refusal under a fence that moved on reports nothing of the caller's: answered.
    plain.create(&run("t")).await.unwrap();
    let first = plain.claim(&run("t"), &worker("a"), ttl(1)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    plain
        .claim(&run("t"), &worker("b"), ttl(60_000))
        .await
        .unwrap();
    let results = waiting
        .end_many(&[Ending::new(first, End::Complete)])
        .await
        .unwrap();
    assert!(
        matches!(
            results[..],
            [Err(Error::StaleFence {
                presented: 1,
                current: 2,
                ..
            })]
        ),
        "{results:?}"
    );
}

/// A fenced script that ends its lease writes the caller's key and ends the run in one
/// script: afterwards the key holds the effect and the run is completed (or suspended,
/// released, completed with a journaled effect) at that fence. Under a stale fence, or a lease
/// already ended, nothing runs and nothing changes; a snippet that raises an error leaves the
/// lease held (Redis keeps what it wrote before the error, as documented).
#[tokio::test]
async fn a_fenced_script_can_end_its_lease_in_the_same_script() {
    let Some(server) = server(true, None) else {
        return;
    };
    let store = connect(&server.url(), &unique_namespace("fencedend")).await;
    let mut conn = raw(&server.url()).await;
    let pay = FencedScript::new("return redis.call('SET', KEYS[1], ARGV[1], 'NX') and 1 or 0");
    for (name, end) in [
        ("complete", End::Complete),
        ("complete-with", End::CompleteWith(b"receipt".to_vec())),
        ("suspend", End::Suspend),
        ("release", End::Release),
    ] {
        let r = run(name);
        store.create(&r).await.unwrap();
        let lease = store.claim(&r, &worker("a"), ttl(60_000)).await.unwrap();
        let key = store.script_key(&r, "payment");
        let wrote: i64 = store
            .fenced_script_with_end(&lease, &pay, &[&key], &["paid"], end.clone())
            .await
            .unwrap();
        assert_eq!(wrote, 1, "{name}");
        let record = store.inspect(&r).await.unwrap();
        assert_eq!(
            (record.state, record.owner, record.fence),
            (end.state(), None, lease.fence()),
            "{name}"
        );
        let paid: Option<String> = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(paid.as_deref(), Some("paid"), "{name}");
        let journal = store.journal(&r).await.unwrap();
        assert_eq!(
            journal.len(),
            usize::from(name == "complete-with"),
            "{name}"
        );
        // The lease is over: the same script again is refused and writes nothing.
        let err = store
            .fenced_script_with_end::<i64, _, _>(&lease, &pay, &[&key], &["twice"], End::Complete)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::LeaseEnded { .. }), "{name}: {err:?}");
    }

    // Stale: nothing runs.
    let r = run("stale");
    store.create(&r).await.unwrap();
    let a = store.claim(&r, &worker("a"), ttl(20)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(40)).await;
    let b = store.claim(&r, &worker("b"), ttl(60_000)).await.unwrap();
    let key = store.script_key(&r, "payment");
    let err = store
        .fenced_script_with_end::<i64, _, _>(&a, &pay, &[&key], &["late"], End::Complete)
        .await
        .unwrap_err();
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
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(exists, 0);
    assert!(store.inspect(&r).await.unwrap().owner.is_some());

    // A snippet that fails: the end is not applied.
    let boom =
        FencedScript::new("redis.call('SET', KEYS[1], 'half'); return redis.error_reply('boom')");
    let err = store
        .fenced_script_with_end::<i64, _, _>(&b, &boom, &[&key], &[] as &[&str], End::Complete)
        .await;
    let record = store.inspect(&r).await.unwrap();
    assert_eq!(
        (record.state, record.owner.is_some()),
        (RunState::Runnable, true),
        "a failing snippet ({err:?}) must not end the lease"
    );
    // End::Committed is no end a script applies.
    let err = store
        .fenced_script_with_end::<i64, _, _>(
            &b,
            &pay,
            &[&key],
            &["x"],
            End::Committed(Ended::Completed),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err:?}");
}

/// A store on the caller's `redis::Client` keeps every other setting of its config, runs the
/// durability guard like `connect`, shows the client's address and never its password, and
/// refuses a Cluster or Sentinel configuration (whose client must not resend writes).
#[tokio::test]
async fn a_store_on_the_callers_client_keeps_the_guard_and_hides_the_password() {
    let Some(safe) = server(true, Some("cl1ent-s3cret")) else {
        return;
    };
    let namespace = unique_namespace("from-client");
    let client = redis::Client::open(safe.url()).unwrap();
    let config = RedisConfig::for_client()
        .with_namespace(&namespace)
        .with_response_timeout(Duration::from_secs(5));
    let store = RedisLeaseStore::from_client(client, config).await.unwrap();
    store.create(&run("r")).await.unwrap();
    let lease = store
        .claim(&run("r"), &worker("w"), ttl(5_000))
        .await
        .unwrap();
    assert_eq!(lease.fence().get(), 1);
    let shown = format!("{store} {store:?}");
    assert!(!shown.contains("cl1ent-s3cret"), "{shown}");
    assert!(shown.contains("127.0.0.1"), "{shown}");
    // The namespace is the config's: a store connected by URL in it sees the run.
    let by_url = connect(&safe.url(), &namespace).await;
    assert_eq!(by_url.inspect(&run("r")).await.unwrap().fence.get(), 1);

    // The guard runs on the caller's client too: no AOF is refused, naming the setting.
    let Some(unsafe_server) = server(false, None) else {
        return;
    };
    let err = RedisLeaseStore::from_client(
        redis::Client::open(unsafe_server.url()).unwrap(),
        RedisConfig::for_client(),
    )
    .await
    .expect_err("a server without AOF is refused");
    assert!(
        matches!(&err, Error::Misconfigured { .. }) && err.to_string().contains("appendonly"),
        "{err}"
    );

    // A Cluster configuration cannot take a single-server client.
    let err = RedisLeaseStore::from_client(
        redis::Client::open(safe.url()).unwrap(),
        RedisConfig::from_url("redis+cluster://127.0.0.1:1,127.0.0.1:2"),
    )
    .await
    .expect_err("a cluster config is refused");
    assert!(
        matches!(&err, Error::Misconfigured { .. })
            && err
                .to_string()
                .contains("from_client takes a client of one server"),
        "{err}"
    );
}

/// A managed-style server whose `CONFIG` is gone (`rename-command CONFIG ""`), with AOF always
/// and noeviction: refused with the plain URL (the sentence names `fsync=asserted`), served
/// with `?fsync=asserted`, which says so in `Display`, in `accepted_risks` and in one warning;
/// what the store can still see (a replica attached without `replicas=N`) is refused all the
/// same, and where `CONFIG` answers the assertion changes nothing.
#[tokio::test]
async fn fsync_asserted_takes_only_the_unreadable_settings_on_trust() {
    let _one_at_a_time = VOLATILE_WARNING.lock().await;
    let Some(server) = lease_conformance::fixtures::required(
        "redis",
        RedisServer::start_options(
            RedisOptions::default()
                .with_appendonly(true)
                .with_maxmemory_policy("noeviction")
                .with_config_renamed(""),
        ),
        "install redis-server (bash scripts/test.sh does it)",
    ) else {
        return;
    };
    let url = server.url();
    let err = RedisLeaseStore::from_url(&url).await.unwrap_err();
    assert!(matches!(err, Error::Misconfigured { .. }), "{err:?}");
    assert!(err.to_string().contains("?fsync=asserted"), "{err}");
    let log = captured();
    let store = RedisLeaseStore::from_url(&format!("{url}?fsync=asserted"))
        .await
        .unwrap();
    store.create(&run("r")).await.unwrap();
    let lease = store
        .claim(&run("r"), &worker("w"), ttl(60_000))
        .await
        .unwrap();
    store.complete(&lease).await.unwrap();
    let accepted = store.accepted_risks();
    assert_eq!(accepted.len(), 1, "{accepted:?}");
    assert!(accepted[0].contains("CONFIG unreadable") && accepted[0].contains("fsync=asserted"));
    let shown = store.to_string();
    assert!(
        shown.contains("fsync=asserted") && !shown.contains("volatile"),
        "{shown}"
    );
    let log = log.lock().unwrap().clone();
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("fsync=asserted: the server's CONFIG cannot be read"))
            .count(),
        1,
        "{log}"
    );
    // A replica it can see, without replicas=N: refused, assertion or not.
    let replica = lease_conformance::fixtures::required(
        "redis",
        RedisServer::start_options(
            RedisOptions::default()
                .with_appendonly(true)
                .with_replicaof(server.port()),
        ),
        "install redis-server",
    )
    .expect("a replica");
    let mut attached = false;
    for _ in 0..100 {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut raw(&url).await)
            .await
            .unwrap();
        if info.contains("connected_slaves:1") {
            attached = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(attached, "the replica attached");
    let err = RedisLeaseStore::from_url(&format!("{url}?fsync=asserted"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("connected_slaves"), "{err}");
    drop(replica);
    // Where CONFIG answers, the settings are read and judged: appendfsync everysec refused.
    let readable = lease_conformance::fixtures::required(
        "redis",
        RedisServer::start_options(RedisOptions::default().with_appendfsync("everysec")),
        "install redis-server",
    )
    .expect("a server");
    let err = RedisLeaseStore::from_url(&format!("{}?fsync=asserted", readable.url()))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("appendfsync"), "{err}");
    let err = RedisLeaseStore::from_url("redis://127.0.0.1:1?fsync=always")
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("fsync=\"always\": expected asserted"),
        "{err}"
    );
}
