//! Wake-ups over pub/sub when things go wrong: the subscription cut by the server, and a user
//! whose ACL gives it no channel.

use std::sync::Arc;
use std::time::Duration;

use lease_conformance::fixtures::{unavailable, unique_namespace, RedisServer};
use lease_conformance::spawn_reporting_worker;
use lease_core::{LeaseStore, RunId, Ttl, WakeReceiver, WorkerId};
use lease_redis::{RedisConfig, RedisLeaseStore};
use lease_runtime::{CancellationToken, WorkerConfig, WorkerReport};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{timeout, Instant};

const HINT: &str = "install redis-server (apt-get install redis-server)";

fn server() -> Option<RedisServer> {
    match RedisServer::start_with(true, None) {
        Ok(server) => Some(server),
        Err(why) => unavailable("redis-server", why, HINT),
    }
}

async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

type Started = mpsc::UnboundedReceiver<(RunId, Instant)>;

/// A worker whose fallback poll is `poll`, reporting each run it starts.
fn start(
    store: &RedisLeaseStore,
    poll: Duration,
) -> (CancellationToken, JoinHandle<WorkerReport>, Started) {
    let config = WorkerConfig::new(Ttl::from_secs(30).unwrap()).with_wake_poll_interval(poll);
    let (tx, rx) = mpsc::unbounded_channel();
    let shutdown = CancellationToken::new();
    let worker = spawn_reporting_worker(
        Arc::new(store.clone()),
        WorkerId::new("waked").unwrap(),
        config,
        tx,
        shutdown.clone(),
    )
    .unwrap();
    let handle = tokio::spawn(async move { worker.await.unwrap().expect("worker") });
    (shutdown, handle, rx)
}

async fn picked_up(store: &RedisLeaseStore, started: &mut Started, id: &str) -> Duration {
    let id = RunId::new(id).unwrap();
    let created = Instant::now();
    store.create(&id).await.expect("create");
    let within = Duration::from_secs(5);
    let (ran, at) = timeout(within, started.recv())
        .await
        .unwrap_or_else(|_| panic!("{id} not started within {within:?}"))
        .expect("worker alive");
    assert_eq!(ran, id);
    at - created
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "{what} not within 10 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn subscribers(url: &str, channel: &str) -> i64 {
    let counts: Vec<(String, i64)> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(&mut raw(url).await)
        .await
        .unwrap();
    counts[0].1
}

/// The server drops the subscribed connection (`CLIENT KILL TYPE pubsub`, as a restart or a
/// proxy would): the store subscribes again, one connection for all its workers, and a run
/// created after that starts long before the worker's minute-long fallback poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_cut_by_the_server_is_replaced() {
    let Some(server) = server() else { return };
    let namespace = unique_namespace("wake");
    let channel = format!("{{lease:{namespace}}}:wake");
    let store =
        RedisLeaseStore::connect(RedisConfig::from_url(server.url()).with_namespace(&namespace))
            .await
            .unwrap();
    let probe: WakeReceiver = store.wakes().expect("wake-ups on by default").subscribe();
    let (shutdown, handle, mut started) = start(&store, Duration::from_secs(60));
    until("live wake-ups", || probe.is_live()).await;
    assert_eq!(subscribers(&server.url(), &channel).await, 1);
    let waited = picked_up(&store, &mut started, "before-cut").await;
    println!("before the cut: started {waited:?} after its create");

    let killed: i64 = redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "pubsub"])
        .query_async(&mut raw(&server.url()).await)
        .await
        .unwrap();
    assert_eq!(killed, 1, "one subscribed connection");
    let deadline = Instant::now() + Duration::from_secs(10);
    while subscribers(&server.url(), &channel).await != 1 {
        assert!(
            Instant::now() < deadline,
            "the store did not subscribe again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    until("live wake-ups again", || probe.is_live()).await;
    let waited = picked_up(&store, &mut started, "after-cut").await;
    println!("after the cut: started {waited:?} after its create");
    shutdown.cancel();
    let report = handle.await.unwrap();
    assert_eq!(report.completed, 2, "{report:?}");
}

/// An ACL user without the channel (Redis 7 gives new users none): its writes still succeed
/// (the scripts' publishes are skipped), its wake-ups never go live, and its workers poll at
/// the short interval instead of waiting for wake-ups that cannot come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_the_channel_writes_and_polls() {
    let Some(server) = server() else { return };
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "nochan",
            "on",
            ">nochan-pw",
            "~*",
            "+@all",
            "resetchannels",
        ])
        .query_async(&mut raw(&server.url()).await)
        .await
        .unwrap();
    let url = format!("redis://nochan:nochan-pw@127.0.0.1:{}", server.port());
    let store = RedisLeaseStore::connect(
        RedisConfig::from_url(url).with_namespace(unique_namespace("wake")),
    )
    .await
    .unwrap();
    let probe = store.wakes().expect("wake-ups on by default").subscribe();
    let (shutdown, handle, mut started) = start(&store, Duration::from_secs(60));
    // Give the subscription time to be refused.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!probe.is_live(), "a refused subscription reads as live");
    for i in 0..3 {
        let waited = picked_up(&store, &mut started, &format!("polled-{i}")).await;
        assert!(waited < Duration::from_secs(5), "{waited:?}");
    }
    shutdown.cancel();
    let report = handle.await.unwrap();
    assert_eq!((report.completed, report.wake_ups), (3, 0), "{report:?}");
}
