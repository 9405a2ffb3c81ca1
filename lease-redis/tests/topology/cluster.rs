//! Redis Cluster: namespaces spread over every master and work there; a plain URL to one node
//! is a configuration error, not a retry loop.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use lease_conformance::assert_unavailable;
use lease_conformance::fixtures::{
    redis_cluster_url, required, unique_namespace, RedisCluster, REDIS_CLUSTER_HINT,
};
use lease_core::{LeaseStore, RunState};
use redis::Value;

use super::{assert_misconfigured, connect, hex, raw, retrying, run, say, ttl, worker};

/// The cluster's URL and a `redis://` URL per seed node (carrying the URL's credentials).
fn cluster() -> Option<(String, Vec<String>)> {
    let url = required("Redis Cluster", redis_cluster_url(), REDIS_CLUSTER_HINT)?;
    let rest = url
        .split_once("://")
        .map(|(_, rest)| rest)
        .expect("a cluster URL");
    let rest = rest.split(['?', '/']).next().unwrap_or_default();
    let (userinfo, hosts) = match rest.rsplit_once('@') {
        Some((userinfo, hosts)) => (format!("{userinfo}@"), hosts),
        None => (String::new(), rest),
    };
    let scheme = if url.starts_with("rediss") {
        "rediss"
    } else {
        "redis"
    };
    let nodes = hosts
        .split(',')
        .map(|host| format!("{scheme}://{userinfo}{host}"))
        .collect();
    Some((url, nodes))
}

/// The master serving each slot range, as `host:port`, from `CLUSTER SLOTS`.
async fn slot_owners(node: &str) -> Vec<(i64, i64, String)> {
    let mut conn = raw(node).await;
    let reply: Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(&mut conn)
        .await
        .unwrap();
    let Value::Array(ranges) = reply else {
        panic!("CLUSTER SLOTS: {reply:?}")
    };
    ranges
        .into_iter()
        .map(|range| {
            let Value::Array(fields) = range else {
                panic!("CLUSTER SLOTS range: {range:?}")
            };
            let int = |v: &Value| match v {
                Value::Int(n) => *n,
                other => panic!("CLUSTER SLOTS: not a number: {other:?}"),
            };
            let Value::Array(master) = &fields[2] else {
                panic!("CLUSTER SLOTS master: {:?}", fields[2])
            };
            let host = match &master[0] {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                other => panic!("CLUSTER SLOTS host: {other:?}"),
            };
            (
                int(&fields[0]),
                int(&fields[1]),
                format!("{host}:{}", int(&master[1])),
            )
        })
        .collect()
}

/// The slot of namespace `ns` (`CLUSTER KEYSLOT {lease:ns}`) and the master serving it.
async fn home(node: &str, owners: &[(i64, i64, String)], ns: &str) -> (i64, String) {
    let mut conn = raw(node).await;
    let slot: i64 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(format!("{{lease:{ns}}}"))
        .query_async(&mut conn)
        .await
        .unwrap();
    let owner = owners
        .iter()
        .find(|(from, to, _)| (*from..=*to).contains(&slot))
        .map(|(_, _, owner)| owner.clone())
        .unwrap_or_else(|| panic!("no master serves slot {slot}: {owners:?}"));
    (slot, owner)
}

/// Namespaces land on every master of the cluster, and on each a run goes through create,
/// claim (fence 1), append, complete and journal, with its record stored on the master that
/// serves the namespace's slot.
#[tokio::test]
async fn namespaces_land_on_every_master_and_each_works_there() {
    let Some((url, nodes)) = cluster() else {
        return;
    };
    let owners = slot_owners(&nodes[0]).await;
    let masters: Vec<String> = {
        let mut m: Vec<String> = owners.iter().map(|(_, _, o)| o.clone()).collect();
        m.sort();
        m.dedup();
        m
    };
    // Two namespaces per master, found by asking the cluster where each would live.
    let mut placed: BTreeMap<String, Vec<(String, i64)>> = BTreeMap::new();
    for _ in 0..1_000 {
        if masters
            .iter()
            .all(|m| placed.get(m).is_some_and(|v| v.len() >= 2))
        {
            break;
        }
        let ns = unique_namespace("spread");
        let (slot, owner) = home(&nodes[0], &owners, &ns).await;
        let here = placed.entry(owner).or_default();
        if here.len() < 2 {
            here.push((ns, slot));
        }
    }
    assert_eq!(
        placed.len(),
        masters.len(),
        "some master got no namespace: {placed:?}"
    );
    if std::env::var_os("REDIS_CLUSTER_URL").is_none() {
        assert_eq!(masters.len(), 3, "the private cluster has 3 masters");
    }

    for (master, namespaces) in &placed {
        for (ns, slot) in namespaces {
            let store = connect(&url, ns).await.expect("connect to the cluster");
            let r = run("r1");
            store.create(&r).await.unwrap();
            let lease = store.claim(&r, &worker("w"), ttl(60_000)).await.unwrap();
            assert_eq!(lease.fence().get(), 1, "{ns}");
            store.append(&lease, ns.as_bytes()).await.unwrap();
            store.complete(&lease).await.unwrap();
            let journal = store.journal(&r).await.unwrap();
            assert_eq!(journal.len(), 1, "{ns}");
            assert_eq!(journal[0].fence.get(), 1);
            assert_eq!(journal[0].payload, ns.as_bytes());
            assert_eq!(store.inspect(&r).await.unwrap().state, RunState::Completed);

            // Behind the adapter: the record is on the master serving the slot (any other
            // node would answer MOVED instead of a count).
            let scheme = url.split("+cluster").next().unwrap_or("redis");
            let userinfo = nodes[0]
                .split_once("://")
                .and_then(|(_, rest)| rest.rsplit_once('@'))
                .map(|(userinfo, _)| format!("{userinfo}@"))
                .unwrap_or_default();
            let mut direct = raw(&format!("{scheme}://{userinfo}{master}")).await;
            let records: i64 = redis::cmd("HLEN")
                .arg(format!("{{lease:{ns}}}:runs"))
                .query_async(&mut direct)
                .await
                .unwrap_or_else(|e| panic!("{ns} is not on {master}: {e}"));
            assert_eq!(records, 1, "{ns} on {master}");
            let present: bool = redis::cmd("HEXISTS")
                .arg(format!("{{lease:{ns}}}:runs"))
                .arg(hex("r1"))
                .query_async(&mut direct)
                .await
                .unwrap();
            assert!(present, "{ns}: run r1 is not in the runs hash on {master}");
            say(&format!(
                "cluster: namespace {ns} (slot {slot}) served by {master}"
            ));
        }
    }
}

/// A plain `redis://` URL to one cluster node, for a namespace whose slot another node
/// serves, fails at once with a configuration error that names the cluster URL form, and is
/// not retryable (a worker would otherwise retry for ever).
#[tokio::test]
async fn a_plain_url_to_one_cluster_node_is_a_configuration_error_naming_the_cluster_url() {
    let Some((_, nodes)) = cluster() else {
        return;
    };
    let owners = slot_owners(&nodes[0]).await;
    let mut conn = raw(&nodes[0]).await;
    // This node's own address as the slot map names it.
    let myself: String = redis::cmd("CLUSTER")
        .arg("MYID")
        .query_async(&mut conn)
        .await
        .unwrap();
    let listing: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut conn)
        .await
        .unwrap();
    let addr = listing
        .lines()
        .find(|line| line.starts_with(&myself))
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|a| a.split('@').next())
        .expect("the node lists itself")
        .to_owned();
    let ns = loop {
        let ns = unique_namespace("elsewhere");
        let (_, owner) = home(&nodes[0], &owners, &ns).await;
        if owner != addr {
            break ns;
        }
    };
    let started = Instant::now();
    let err = connect(&nodes[0], &ns).await.unwrap_err();
    let took = started.elapsed();
    assert_misconfigured(&err, "redis+cluster://");
    assert!(
        took < Duration::from_secs(2),
        "refused at once, not after retries: {took:?}"
    );
    say(&format!("plain URL to cluster node {addr}: {err}"));
}

/// A namespace of `cluster` whose slot the node on `port` serves (or, with `on` false, does
/// not serve).
async fn namespace_on(cluster: &RedisCluster, port: u16, on: bool) -> String {
    let seed = format!("redis://127.0.0.1:{}", cluster.ports()[0]);
    let owners = slot_owners(&seed).await;
    let addr = format!("127.0.0.1:{port}");
    loop {
        let ns = unique_namespace("down");
        if (home(&seed, &owners, &ns).await.1 == addr) == on {
            return ns;
        }
    }
}

/// When a master without replica dies the cluster goes down: operations on every namespace
/// fail with a retryable `Unavailable` (CLUSTERDOWN, or the dead node unreachable), never a
/// verdict; once the node restarts from its AOF the same stores carry on, with fences above
/// those issued before.
#[tokio::test]
async fn a_cluster_down_is_retryable_and_fences_move_on_after_the_node_returns() {
    let Some(mut cluster) = required(
        "Redis Cluster",
        RedisCluster::start_with(3, Duration::from_millis(1_000)),
        REDIS_CLUSTER_HINT,
    ) else {
        return;
    };
    let dead = cluster.ports()[0];
    let on_dead = namespace_on(&cluster, dead, true).await;
    let elsewhere = namespace_on(&cluster, dead, false).await;
    let r = run("r");
    let mut stores = Vec::new();
    for ns in [&on_dead, &elsewhere] {
        let store = connect(&cluster.url(), ns).await.unwrap();
        store.create(&r).await.unwrap();
        let lease = store.claim(&r, &worker("a"), ttl(60_000)).await.unwrap();
        store.release(&lease).await.unwrap();
        stores.push(store);
    }

    cluster.node_mut(0).stop(); // SIGKILL
    cluster.wait_down(Duration::from_secs(10)).unwrap();
    for (store, ns) in stores.iter().zip([&on_dead, &elsewhere]) {
        let err = store
            .claim(&r, &worker("b"), ttl(60_000))
            .await
            .unwrap_err();
        assert_unavailable(&err, "redis");
        say(&format!("cluster down, namespace {ns}: {err}"));
    }

    cluster.node_mut(0).restart().unwrap();
    cluster.wait_ok(Duration::from_secs(20)).unwrap();
    for store in &stores {
        let b = worker("b");
        let lease = retrying(
            Duration::from_secs(10),
            "claim after the node returned",
            || store.claim(&r, &b, ttl(60_000)),
        )
        .await;
        assert_eq!(
            lease.fence().get(),
            2,
            "the refused claims changed nothing and fence 1 survived"
        );
    }
}

/// A cluster master restarted without AOF under running stores (its data gone, its slots
/// kept): the guard, read again on a Cluster every half second from the master that serves
/// the store's namespace, stops the store whose namespace lives there with the durability
/// error naming `appendonly`; a store whose namespace lives on another master is not that
/// node's business and keeps renewing throughout. (What the stopped store saw in between is
/// printed: the re-check interval is a window the adapter documents.)
#[tokio::test]
async fn a_cluster_node_restarted_without_aof_stops_only_the_stores_it_serves() {
    let Some(mut cluster) = required("Redis Cluster", RedisCluster::start(), REDIS_CLUSTER_HINT)
    else {
        return;
    };
    let port = cluster.ports()[0];
    let on_node = namespace_on(&cluster, port, true).await;
    let elsewhere = namespace_on(&cluster, port, false).await;
    let r = run("r");
    let mut stores = Vec::new();
    let mut leases = Vec::new();
    for ns in [&on_node, &elsewhere] {
        let store = connect(&cluster.url(), ns).await.unwrap();
        store.create(&r).await.unwrap();
        leases.push(store.claim(&r, &worker("a"), ttl(60_000)).await.unwrap());
        stores.push(store);
    }

    let node = cluster.node_mut(0);
    let options = node.options_mut();
    *options = options.clone().with_appendonly(false);
    node.restart().unwrap();
    let restarted = Instant::now();

    let mut before = Vec::new();
    let err = loop {
        match stores[0].inspect(&r).await {
            Err(e @ lease_core::Error::Misconfigured { .. }) => break e,
            other => {
                let seen = format!("{other:?}");
                if !before.contains(&seen) {
                    before.push(seen);
                }
                assert!(
                    restarted.elapsed() < Duration::from_secs(10),
                    "{on_node}: no durability error 10 s after the restart; saw {before:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert_misconfigured(&err, "appendonly");
    let err = stores[0]
        .claim(&r, &worker("b"), ttl(60_000))
        .await
        .unwrap_err();
    assert_misconfigured(&err, "appendonly");
    say(&format!(
        "cluster node restarted without AOF: namespace {on_node} refused {:?} after the \
         restart (before that: {before:?}): {err}",
        restarted.elapsed()
    ));
    // Well past several re-checks, the other namespace's lease still renews every time.
    let mut renewed = 0;
    while restarted.elapsed() < Duration::from_secs(3) {
        let lease = stores[1]
            .renew(&leases[1])
            .await
            .unwrap_or_else(|e| panic!("{elsewhere}, served by another master: {e:?}"));
        assert_eq!(lease.fence(), leases[1].fence());
        renewed += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    say(&format!(
        "namespace {elsewhere} on another master: {renewed} renewals, none refused"
    ));
}

/// A master that does not serve the namespace is SIGKILLed, on a cluster that keeps serving
/// the slots it still covers (`cluster-require-full-coverage no`) and marks the node failed
/// after 1 s: before and after the cluster notices, every renewal of the namespace's leases
/// keeps succeeding, and a scope heartbeating through the same store is never cancelled: one
/// dead node stalls only its own slots.
#[tokio::test]
async fn a_dead_master_elsewhere_leaves_the_namespace_renewing() {
    let Some(mut cluster) = required(
        "Redis Cluster",
        RedisCluster::start_with(3, Duration::from_secs(1)),
        REDIS_CLUSTER_HINT,
    ) else {
        return;
    };
    for node in cluster.nodes() {
        node.command(&["CONFIG", "SET", "cluster-require-full-coverage", "no"])
            .unwrap();
    }
    let dead = cluster.ports()[0];
    let ns = namespace_on(&cluster, dead, false).await;
    let store = std::sync::Arc::new(connect(&cluster.url(), &ns).await.unwrap());
    let leases: Vec<lease_core::Lease> = {
        let runs: Vec<lease_core::RunId> = (0..20).map(|i| run(&format!("r{i}"))).collect();
        store.create_many(&runs).await.unwrap();
        store
            .claim_next(&worker("a"), ttl(3_000), 20)
            .await
            .unwrap()
    };
    assert_eq!(leases.len(), 20);
    store.create(&run("scoped")).await.unwrap();
    let scope = lease_runtime::RunScope::claim(
        store.clone(),
        &run("scoped"),
        &worker("a"),
        ttl(3_000),
        lease_runtime::ScopeConfig::default(),
    )
    .await
    .unwrap();

    cluster.node_mut(0).stop(); // SIGKILL
    let killed = Instant::now();
    let mut rounds = 0;
    while killed.elapsed() < Duration::from_secs(5) {
        let results = store
            .renew_many(&leases)
            .await
            .unwrap_or_else(|e| panic!("{:?} after the kill: {e:?}", killed.elapsed()));
        for result in results {
            result.unwrap_or_else(|e| panic!("{:?} after the kill: {e:?}", killed.elapsed()));
        }
        rounds += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !scope.is_cancelled(),
        "the scope was cancelled: {:?}",
        scope.cancel_reason()
    );
    assert!(
        scope.renewals() >= 3,
        "the scope renewed {} times",
        scope.renewals()
    );
    say(&format!(
        "master {dead} killed: namespace {ns} renewed 20 leases {rounds} times in 5 s without \
         a failure; its scope renewed {} times",
        scope.renewals()
    ));
    scope.complete().await.unwrap();
}

/// A Cluster whose namespace's master has a replica can fail over, so `replicas=0` is refused
/// at connect naming `replicas=` (accepted with `volatile=true`, shown). With `replicas=1`,
/// the claim and its `WAIT` travel on one connection: with the replica frozen (SIGSTOP: no
/// acknowledgements) the claim blocks in `WAIT`, and when that client connection is killed on
/// the master (`CLIENT KILL`) no lease is returned: a `WAIT` sent again on a new connection
/// would confirm nothing (it made no write) and answer at once.
#[tokio::test]
async fn a_cluster_with_replicas_needs_acknowledgement_and_a_wait_is_never_resent() {
    let Some(mut cluster) = required(
        "Redis Cluster",
        RedisCluster::start_with(3, Duration::from_secs(15)),
        REDIS_CLUSTER_HINT,
    ) else {
        return;
    };
    let master = cluster.ports()[0];
    let ns = namespace_on(&cluster, master, true).await;
    let replica = cluster
        .add_replica(
            0,
            lease_conformance::fixtures::RedisOptions::default().with_bind(&["127.0.0.1"]),
        )
        .unwrap();

    let err = connect(&cluster.url(), &ns).await.unwrap_err();
    assert_misconfigured(&err, "replicas=");
    say(&format!(
        "cluster with a replica, replicas=0: refused: {err}"
    ));
    let volatile = connect(&format!("{}?volatile=true", cluster.url()), &ns)
        .await
        .unwrap();
    assert_eq!(
        volatile.accepted_risks(),
        ["replicas=0 on a Cluster with replicas"]
    );
    drop(volatile);

    let config = lease_redis::RedisConfig::from_url(format!(
        "{}?replicas=1&replica_timeout_ms=4000",
        cluster.url()
    ))
    .with_namespace(&ns)
    .with_response_timeout(Duration::from_secs(8));
    let store = std::sync::Arc::new(lease_redis::RedisLeaseStore::connect(config).await.unwrap());
    let r = run("r");
    store.create(&r).await.unwrap();
    let first = store.claim(&r, &worker("a"), ttl(1)).await.unwrap();
    assert_eq!(
        first.fence().get(),
        1,
        "acknowledged while the replica follows"
    );
    tokio::time::sleep(Duration::from_millis(10)).await;

    let pid = cluster.nodes()[replica].pid().unwrap().to_string();
    let signal = |sig: &str| {
        let status = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap();
        assert!(status.success(), "kill {sig} {pid}");
    };
    signal("-STOP");
    let claiming = {
        let (store, r) = (store.clone(), r.clone());
        tokio::spawn(async move { store.claim(&r, &worker("b"), ttl(60_000)).await })
    };
    let node = &cluster.nodes()[0];
    let deadline = Instant::now() + Duration::from_secs(3);
    let killed = loop {
        let clients = node.command(&["CLIENT", "LIST"]).unwrap();
        let waiting = clients
            .lines()
            .find(|line| line.contains("cmd=wait"))
            .and_then(|line| line.split_whitespace().next())
            .and_then(|field| field.strip_prefix("id="))
            .map(str::to_owned);
        if let Some(id) = waiting {
            node.command(&["CLIENT", "KILL", "ID", &id]).unwrap();
            break id;
        }
        assert!(
            Instant::now() < deadline,
            "no client blocked in WAIT: {clients}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let answer = claiming.await.unwrap();
    signal("-CONT");
    say(&format!(
        "cluster, replica frozen, client {killed} killed while blocked in WAIT: claim answered \
         {answer:?}"
    ));
    let err = answer.expect_err("a lease was handed out without its replica");
    assert!(err.is_retryable(), "{err:?}");
}
