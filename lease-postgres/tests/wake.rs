//! Wake-ups over LISTEN/NOTIFY when things go wrong: the listening session cut under the
//! store, a notification that never arrives, and a store told not to listen.

use std::sync::Arc;
use std::time::Duration;

use lease_conformance::fixtures::{postgres_url, unique_namespace};
use lease_conformance::spawn_reporting_worker;
use lease_core::{Kind, LeaseStore, LeaseStoreExt, RunId, Ttl, WorkerId};
use lease_postgres::{sqlx, PostgresConfig, PostgresLeaseStore};
use lease_runtime::{CancellationToken, WorkerConfig, WorkerReport};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{timeout, Instant};

async fn store(
    config: impl FnOnce(PostgresConfig) -> PostgresConfig,
) -> Option<PostgresLeaseStore> {
    let url = postgres_url().await?;
    let config = config(PostgresConfig::from_url(url).with_schema(unique_namespace("lease_wake")));
    Some(PostgresLeaseStore::connect(config).await.expect("connect"))
}

type Started = mpsc::UnboundedReceiver<(RunId, Instant)>;

/// A worker on `store` whose fallback poll is `poll`, reporting each run it starts.
fn start(
    store: &PostgresLeaseStore,
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

/// Creates `id` and waits for the worker to start it; how long that took.
async fn picked_up(
    store: &PostgresLeaseStore,
    started: &mut Started,
    id: &str,
    within: Duration,
) -> Duration {
    let id = RunId::new(id).unwrap();
    let created = Instant::now();
    store.create(&id).await.expect("create");
    let (ran, at) = timeout(within, started.recv())
        .await
        .unwrap_or_else(|_| panic!("{id} not started within {within:?}"))
        .expect("worker alive");
    assert_eq!(ran, id);
    at - created
}

/// The backends listening on the store's channel.
async fn listeners(store: &PostgresLeaseStore) -> Vec<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE query = 'LISTEN \"lease_wake_' || md5($1) || '\"'",
    )
    .bind(store.schema())
    .fetch_all(store.pool())
    .await
    .expect("pg_stat_activity")
}

async fn until_listening(store: &PostgresLeaseStore) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pids = listeners(store).await;
        if !pids.is_empty() {
            return pids;
        }
        assert!(
            Instant::now() < deadline,
            "no session listens for the store's wake-ups"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The listening session is terminated by the server (a failover, an idle-session killer, an
/// operator): the store listens again on a new session, one for all its workers, and a run
/// created after that is started long before the worker's minute-long fallback poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listening_session_cut_by_the_server_is_replaced() {
    let Some(store) = store(|c| c).await else {
        return;
    };
    let (shutdown, handle, mut started) = start(&store, Duration::from_secs(60));
    let first = until_listening(&store).await;
    assert_eq!(first.len(), 1, "one listening session per store: {first:?}");
    let waited = picked_up(&store, &mut started, "before-cut", Duration::from_secs(5)).await;
    println!("before the cut: started {waited:?} after its create");

    for pid in &first {
        let cut: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert!(cut, "pg_terminate_backend({pid})");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let second = loop {
        let pids = listeners(&store).await;
        if !pids.is_empty() && pids.iter().all(|p| !first.contains(p)) {
            break pids;
        }
        assert!(
            Instant::now() < deadline,
            "the store did not listen again: {pids:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(second.len(), 1, "{second:?}");
    let waited = picked_up(&store, &mut started, "after-cut", Duration::from_secs(5)).await;
    println!("after the cut: started {waited:?} after its create");
    shutdown.cancel();
    let report = handle.await.unwrap();
    assert_eq!(report.completed, 2, "{report:?}");
}

/// A notification that never arrives (here the trigger is disabled, as if the session had
/// dropped it) delays the run by at most the fallback poll, not forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_notification_costs_at_most_the_fallback_poll() {
    let Some(store) = store(|c| c).await else {
        return;
    };
    let poll = Duration::from_millis(1_500);
    let (shutdown, handle, mut started) = start(&store, poll);
    until_listening(&store).await;
    // Past the first wake-up every new session sends.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let table = format!("\"{}\".runs", store.schema());
    sqlx::query(&format!("ALTER TABLE {table} DISABLE TRIGGER runs_wake"))
        .execute(store.pool())
        .await
        .unwrap();
    let waited = picked_up(&store, &mut started, "unannounced", poll * 3).await;
    println!("unannounced: started {waited:?} after its create (fallback poll {poll:?})");
    assert!(
        waited <= poll + Duration::from_secs(1),
        "{waited:?} > the poll {poll:?} and a second"
    );
    sqlx::query(&format!("ALTER TABLE {table} ENABLE TRIGGER runs_wake"))
        .execute(store.pool())
        .await
        .unwrap();
    shutdown.cancel();
    let report = handle.await.unwrap();
    assert_eq!(report.completed, 1, "{report:?}");
}

/// `wake_ups=false` (behind PgBouncer in transaction mode): no wake-ups, no listening session;
/// the workers poll, and still run everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_told_not_to_listen_polls() {
    let Some(url) = postgres_url().await else {
        return;
    };
    let url = format!(
        "{url}{}wake_ups=false",
        if url.contains('?') { '&' } else { '?' }
    );
    let config = PostgresConfig::from_url(url).with_schema(unique_namespace("lease_wake"));
    let store = PostgresLeaseStore::connect(config).await.expect("connect");
    assert!(store.wakes().is_none(), "wake_ups=false still wakes");
    let (shutdown, handle, mut started) = start(&store, Duration::from_secs(60));
    picked_up(&store, &mut started, "polled", Duration::from_secs(5)).await;
    assert!(
        listeners(&store).await.is_empty(),
        "a session listens with wake_ups=false"
    );
    shutdown.cancel();
    let report = handle.await.unwrap();
    assert_eq!((report.completed, report.wake_ups), (1, 0), "{report:?}");
}

/// Waits for a wake-up of `kind` on `rx` for at most `within`; whether one came.
async fn woken_within(rx: &mut lease_core::WakeReceiver, kind: &Kind, within: Duration) -> bool {
    timeout(within, rx.woken(std::slice::from_ref(kind)))
        .await
        .is_ok()
}

/// The trigger in the caller's transaction: a run created (`create_in`) or released
/// (`end_in`) there wakes the workers when the transaction commits, never before and never if
/// it rolls back; an id purged and created again wakes them too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_callers_transaction_wakes_at_its_commit_and_never_on_rollback() {
    let Some(store) = store(|c| c).await else {
        return;
    };
    let kind = Kind::default();
    let wakes = store.wakes().expect("wake-ups are on");
    let mut rx = wakes.subscribe();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !rx.is_live() {
        assert!(Instant::now() < deadline, "the listener did not start");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    rx.clear();

    // Rolled back: nothing.
    let mut tx = store.pool().begin().await.unwrap();
    store
        .create_in(&mut tx, &RunId::new("undone").unwrap())
        .await
        .unwrap();
    assert!(
        !woken_within(&mut rx, &kind, Duration::from_millis(500)).await,
        "woken before the commit"
    );
    tx.rollback().await.unwrap();
    assert!(
        !woken_within(&mut rx, &kind, Duration::from_millis(500)).await,
        "woken by a transaction that rolled back"
    );

    // Committed: a wake-up, at the commit.
    let run = RunId::new("enqueued").unwrap();
    let mut tx = store.pool().begin().await.unwrap();
    store.create_in(&mut tx, &run).await.unwrap();
    tx.commit().await.unwrap();
    assert!(
        woken_within(&mut rx, &kind, Duration::from_secs(5)).await,
        "no wake-up for a create_in that committed"
    );

    // Released in the caller's transaction.
    let lease = store
        .claim(
            &run,
            &WorkerId::new("w").unwrap(),
            Ttl::from_secs(30).unwrap(),
        )
        .await
        .unwrap();
    rx.clear();
    let mut tx = store.pool().begin().await.unwrap();
    store.fence_in(&mut tx, &lease).await.unwrap();
    store
        .end_in(&mut tx, &lease, lease_core::End::Release)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(
        woken_within(&mut rx, &kind, Duration::from_secs(5)).await,
        "no wake-up for an end_in release that committed"
    );

    // Purged, then created again at its last fence.
    let lease = store
        .claim(
            &run,
            &WorkerId::new("w").unwrap(),
            Ttl::from_secs(30).unwrap(),
        )
        .await
        .unwrap();
    store.complete(&lease).await.unwrap();
    let purged = store.purge(Duration::ZERO, 10).await.unwrap();
    assert_eq!(purged, std::slice::from_ref(&run));
    rx.clear();
    let again = store.create(&run).await.unwrap();
    assert_eq!(
        again.fence,
        lease.fence(),
        "created again at its last fence"
    );
    assert!(
        woken_within(&mut rx, &kind, Duration::from_secs(5)).await,
        "no wake-up for an id purged and created again"
    );
}

/// A store with wake-ups off notifies nobody (its sessions start with `lease.wake_ups = off`,
/// which the trigger reads): a listening store of the same schema hears its creates only at
/// its fallback poll, and hears its own at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_without_wake_ups_notifies_nobody() {
    let Some(listening) = store(|c| c).await else {
        return;
    };
    let url = postgres_url().await.unwrap();
    let quiet = PostgresLeaseStore::connect(
        PostgresConfig::from_url(url)
            .with_schema(listening.schema())
            .with_migrations(false)
            .with_wake_ups(false),
    )
    .await
    .unwrap();
    let wakes = listening.wakes().unwrap();
    let mut rx = wakes.subscribe();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !rx.is_live() {
        assert!(Instant::now() < deadline, "the listener did not start");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    rx.clear();
    let kind = Kind::default();
    quiet.create(&RunId::new("silent").unwrap()).await.unwrap();
    let mut tx = quiet.pool().begin().await.unwrap();
    quiet
        .create_in(&mut tx, &RunId::new("silent-in-tx").unwrap())
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(
        !woken_within(&mut rx, &kind, Duration::from_secs(1)).await,
        "a store without wake-ups notified"
    );
    listening
        .create(&RunId::new("loud").unwrap())
        .await
        .unwrap();
    assert!(
        woken_within(&mut rx, &kind, Duration::from_secs(5)).await,
        "the listening store's own create did not wake it"
    );
}

/// A plain `LISTEN` session on the schema's channel (its name computed as the trigger does).
async fn raw_listener(store: &PostgresLeaseStore) -> sqlx::postgres::PgListener {
    let channel: String = sqlx::query_scalar("SELECT 'lease_wake_' || md5($1)")
        .bind(store.schema())
        .fetch_one(store.pool())
        .await
        .unwrap();
    let mut listener = sqlx::postgres::PgListener::connect_with(store.pool())
        .await
        .unwrap();
    listener.listen(&channel).await.unwrap();
    listener
}

/// The next notification's payload.
async fn next(listener: &mut sqlx::postgres::PgListener) -> String {
    timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("no notification within 5 s")
        .unwrap()
        .payload()
        .to_owned()
}

/// The store's own writes are notified by its notifier once they commit: what a raw `LISTEN`
/// on the schema's channel receives. A run due at an instant is announced with the
/// milliseconds left on the database clock when the notification is sent (notify.sql); runs of
/// one kind and delay created in one batch are announced once; a retry delay carries its
/// milliseconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stores_own_writes_are_announced_after_they_commit() {
    let Some(store) = store(|c| c).await else {
        return;
    };
    let mut listener = raw_listener(&store).await;
    let due = std::time::SystemTime::now() + Duration::from_secs(3);
    store
        .create_with(&lease_core::NewRun::new(RunId::new("at").unwrap()).with_run_at(due))
        .await
        .unwrap();
    let payload = next(&mut listener).await;
    let ms: u64 = payload
        .strip_prefix("default ")
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("payload {payload:?}"));
    assert!(
        (1_500..=3_000).contains(&ms),
        "a run due in 3 s announced as due in {ms} ms"
    );

    let mail = Kind::new("mail").unwrap();
    let batch: Vec<lease_core::NewRun> = (0..50)
        .map(|i| {
            lease_core::NewRun::new(RunId::new(format!("m{i}")).unwrap()).with_kind(mail.clone())
        })
        .collect();
    store.create_many_with(&batch).await.unwrap();
    assert_eq!(next(&mut listener).await, "mail 0");

    let lease = store
        .claim(
            &RunId::new("m0").unwrap(),
            &WorkerId::new("w").unwrap(),
            Ttl::from_secs(30).unwrap(),
        )
        .await
        .unwrap();
    store
        .retry_after(&lease, Duration::from_millis(1_500))
        .await
        .unwrap();
    assert_eq!(next(&mut listener).await, "mail 1500");
    // Nothing else was sent: the batch's 50 runs were one notification.
    assert!(
        timeout(Duration::from_millis(500), listener.recv())
            .await
            .is_err(),
        "more notifications than writes"
    );
}

/// A store whose notifier task ended with the runtime it was started on starts it again on
/// the runtime of its next write: that write is still announced. (A Tokio runtime shut down
/// under a pool also breaks its idle sessions; the store's calls fail once per such session.)
#[test]
fn the_notifier_starts_again_on_the_next_runtime() {
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    let first = runtime();
    let Some(store) = first.block_on(store(|c| c)) else {
        return;
    };
    first.block_on(async {
        store
            .create(&RunId::new("on-the-first").unwrap())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    });
    drop(first);
    let second = runtime();
    second.block_on(async {
        // The pool's idle sessions belong to the first runtime: each fails once and is
        // dropped (as after a server restart), so the store answers again after a few calls.
        let mut answered = 0;
        for _ in 0..50 {
            answered = if store.count().await.is_ok() {
                answered + 1
            } else {
                0
            };
            if answered == 5 {
                break;
            }
        }
        assert_eq!(
            answered, 5,
            "the store did not answer on the second runtime"
        );
        let mut listener = raw_listener(&store).await;
        let mail = Kind::new("mail").unwrap();
        store
            .create_with(
                &lease_core::NewRun::new(RunId::new("on-the-second").unwrap()).with_kind(mail),
            )
            .await
            .unwrap();
        assert_eq!(next(&mut listener).await, "mail 0");
    });
}
