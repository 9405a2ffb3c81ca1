//! The benchmarks of a run's life against a real server (figures in BENCHMARKS.md):
//! `cargo test --release -p lease-redis --test purge_load -- --ignored --nocapture`. Ignored in
//! `cargo test`: the purge benchmark creates and completes 100,000 runs first.
lease_conformance::life_benchmarks!(lease_conformance::fixtures::redis());

mod support;

/// Retention that deletes, at scale: a million runs created, completed and purged 1,000 at a
/// time on a private redis-server; the namespace's keys (and their entries: fields, members,
/// elements) and the server's `used_memory` every 100,000 runs. `LEASE_FLAT_RUNS` sets the
/// total.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run with --ignored --release"]
async fn a_million_runs_purged_leave_the_keys_flat() {
    use lease_conformance::fixtures::{unavailable, unique_namespace, RedisServer};
    let server = match RedisServer::start_with(true, None) {
        Ok(server) => server,
        Err(why) => {
            let _: Option<()> = unavailable("redis-server", why, "install redis-server");
            return;
        }
    };
    let total = std::env::var("LEASE_FLAT_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let ns = unique_namespace("flat");
    let store = lease_redis::RedisLeaseStore::connect(
        lease_redis::RedisConfig::from_url(server.url()).with_namespace(&ns),
    )
    .await
    .unwrap();
    let client = redis::Client::open(server.url()).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    let measure = || {
        let mut conn = conn.clone();
        let ns = ns.clone();
        async move {
            let per_key = support::entries(&mut conn, &ns).await;
            let entries: u64 = per_key.values().sum();
            let info: String = redis::cmd("INFO")
                .arg("memory")
                .query_async(&mut conn)
                .await
                .unwrap();
            let used = info
                .lines()
                .find_map(|l| l.strip_prefix("used_memory:"))
                .unwrap_or("?")
                .trim()
                .to_owned();
            format!(
                "{} keys, {entries} entries, used_memory {used} B",
                per_key.len()
            )
        }
    };
    for line in lease_conformance::churn_in_batches(&store, total, 1_000, 100_000, measure).await {
        eprintln!("flat: {line}");
    }
}
