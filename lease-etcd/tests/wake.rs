//! Wake-ups over the etcd watch: what puts a wake key and what does not (claims, renewals and
//! completions must not wake an idle fleet), the watch moving to another member when its own
//! dies, and a store told not to watch. One at a time (`--test-threads=1`): each starts its
//! own three-member cluster.

use std::time::Duration;

use lease_conformance::fixtures::etcd::{EtcdCluster, HINT, MEMBERS};
use lease_conformance::fixtures::required;
use lease_core::{
    Error, Kind, LeaseStore, LeaseStoreExt, NewRun, RunId, Ttl, WakeReceiver, WorkerId,
};
use lease_etcd::{EtcdConfig, EtcdLeaseStore};
use tokio::time::{timeout, Instant};

fn endpoints(cluster: &EtcdCluster) -> Vec<String> {
    (0..MEMBERS).map(|i| cluster.endpoint(i)).collect()
}

fn cluster() -> Option<EtcdCluster> {
    required(
        "etcd cluster",
        EtcdCluster::start().map_err(|e| e.to_string()),
        HINT,
    )
}

/// The revision at which `kind`'s wake key under `prefix` was last put (0: never).
async fn wake_key_revision(cluster: &EtcdCluster, prefix: &str, kind: &str) -> i64 {
    let mut client = lease_etcd::rpc::Client::connect([cluster.endpoint(0)], None)
        .await
        .unwrap();
    let key = format!("{prefix}\0w\0{kind}");
    let got = client.get(key, None).await.unwrap();
    got.kvs().first().map_or(0, |kv| kv.mod_revision())
}

async fn live(rx: &WakeReceiver, within: Duration) {
    let deadline = Instant::now() + within;
    while !rx.is_live() {
        assert!(
            Instant::now() < deadline,
            "wake-ups not live within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_renewals_and_completions_wake_nobody() {
    let Some(cluster) = cluster() else { return };
    let store = EtcdLeaseStore::connect(EtcdConfig::new(endpoints(&cluster), "quiet").unwrap())
        .await
        .unwrap();
    let kind = Kind::new("quiet").unwrap();
    let wakes = store.wakes().expect("wake-ups are on by default");
    let mut rx = wakes.subscribe();
    live(&rx, Duration::from_secs(10)).await;
    rx.clear();
    let runs: Vec<NewRun> = (0..20)
        .map(|i| NewRun::new(RunId::new(format!("q-{i:02}")).unwrap()).with_kind(kind.clone()))
        .collect();
    for r in store.create_many_with(&runs).await.unwrap() {
        r.unwrap();
    }
    timeout(
        Duration::from_secs(5),
        rx.woken(std::slice::from_ref(&kind)),
    )
    .await
    .expect("a create_many wakes its kind");
    // A batch larger than one etcd transaction puts the key once per transaction: let every
    // put of the create_many arrive before the quiet part starts.
    tokio::time::sleep(Duration::from_millis(300)).await;
    rx.clear();
    let put_at = wake_key_revision(&cluster, "quiet", "quiet").await;
    assert!(put_at > 0, "the create_many put the kind's wake key");
    let worker = WorkerId::new("busy").unwrap();
    let leases = store
        .claim_next_kind(&kind, &worker, Ttl::from_secs(30).unwrap(), 20)
        .await
        .unwrap();
    assert_eq!(leases.len(), 20);
    let renewed: Vec<_> = store
        .renew_many(&leases)
        .await
        .unwrap()
        .into_iter()
        .map(Result::unwrap)
        .collect();
    for lease in &renewed[..10] {
        store.complete(lease).await.unwrap();
    }
    for lease in &renewed[10..] {
        store.fail(lease, "no").await.unwrap();
    }
    let quiet = timeout(
        Duration::from_secs(1),
        rx.woken(std::slice::from_ref(&kind)),
    )
    .await;
    assert!(
        quiet.is_err(),
        "claims, renewals, completions and failures woke an idle worker"
    );
    assert_eq!(
        wake_key_revision(&cluster, "quiet", "quiet").await,
        put_at,
        "claims, renewals, completions and failures put the wake key (even a delayed wake-up \
         sets every idle worker a timer)"
    );
    // The same receiver still hears a release.
    let last = RunId::new("q-last").unwrap();
    store
        .create_with(&NewRun::new(last.clone()).with_kind(kind.clone()))
        .await
        .unwrap();
    let lease = store
        .claim_next_kind(&kind, &worker, Ttl::from_secs(30).unwrap(), 1)
        .await
        .unwrap()
        .remove(0);
    rx.clear();
    store.release(&lease).await.unwrap();
    timeout(
        Duration::from_secs(5),
        rx.woken(std::slice::from_ref(&kind)),
    )
    .await
    .expect("a release wakes its kind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_moves_to_another_member_when_its_own_dies() {
    let Some(mut cluster) = cluster() else { return };
    let store = EtcdLeaseStore::connect(EtcdConfig::new(endpoints(&cluster), "moved").unwrap())
        .await
        .unwrap();
    let kind = Kind::new("moved").unwrap();
    let wakes = store.wakes().unwrap();
    let mut rx = wakes.subscribe();
    live(&rx, Duration::from_secs(10)).await;
    // The watch opens on the first member that answers: member 0, unless it was slow.
    let watched = watched_member(&cluster, None);
    rx.clear();
    tokio::task::block_in_place(|| cluster.kill(watched));
    // The session ends; the next one, on another member, starts with a wake-up for every
    // kind (sent only by a new session: nothing else is written meanwhile). Waiting for the
    // flag to drop instead would race with a reconnect faster than the test's polling.
    timeout(Duration::from_secs(20), rx.woken(&[]))
        .await
        .expect("no new watch session within 20 s of its member's death");
    live(&rx, Duration::from_secs(20)).await;
    // Served by one of the members left.
    watched_member(&cluster, Some(watched));
    rx.clear();
    let run = RunId::new("after").unwrap();
    let created = Instant::now();
    // The store's own calls fail over too; a call may meet the dead member first.
    let mut made = false;
    while !made {
        match store
            .create_with(&NewRun::new(run.clone()).with_kind(kind.clone()))
            .await
        {
            Ok(_) | Err(Error::AlreadyExists { .. }) => made = true,
            Err(e) if e.is_retryable() && created.elapsed() < Duration::from_secs(20) => {}
            Err(e) => panic!("create after the member's death: {e}"),
        }
    }
    timeout(
        Duration::from_secs(5),
        rx.woken(std::slice::from_ref(&kind)),
    )
    .await
    .expect("the new watch hears the create");
    tokio::task::block_in_place(|| cluster.restart(watched)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_told_not_to_watch_has_no_wake_ups() {
    let Some(cluster) = cluster() else { return };
    let config = EtcdConfig::new(endpoints(&cluster), "unwatched")
        .unwrap()
        .with_wake_ups(false);
    let store = EtcdLeaseStore::connect(config).await.unwrap();
    assert!(store.wakes().is_none());
    let url = format!(
        "etcd://{}/unwatched?wake_ups=false",
        cluster.endpoint(0).trim_start_matches("http://")
    );
    assert!(!EtcdConfig::from_url(&url).unwrap().wake_ups());
    let bad = EtcdConfig::from_url(&url.replace("false", "maybe")).unwrap_err();
    assert!(
        bad.to_string()
            .contains("wake_ups=\"maybe\" must be true or false"),
        "{bad}"
    );
}

/// The one member that serves a watch (the store's own, the only one in its cluster), among
/// the members but `dead`.
fn watched_member(cluster: &EtcdCluster, dead: Option<usize>) -> usize {
    let counts: Vec<(usize, u64)> = (0..MEMBERS)
        .filter(|&i| Some(i) != dead)
        .map(|i| (i, cluster.watchers(i).unwrap()))
        .collect();
    let serving: Vec<usize> = counts
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(i, _)| *i)
        .collect();
    assert_eq!(serving.len(), 1, "(member, watchers): {counts:?}");
    serving[0]
}
