//! The adapter in the deployments people run, on private real servers: a 3-master Redis
//! Cluster (namespaces on every master, a plain URL refused, a master lost and back), a primary
//! with replicas failing over (by hand, under load, and through Sentinel), the replies that mean
//! "not now" (READONLY, BUSY, CLUSTERDOWN), and the durability guard against eviction,
//! `appendfsync everysec`, a forbidden `CONFIG` and a server restarted without persistence
//! under a running store.
//!
//! Each test starts its own servers (the cluster tests share one cluster per process, or use
//! `REDIS_CLUSTER_URL`), and fails saying what to install when it cannot
//! (`LEASE_TEST_SKIP_SERVERS=1` skips).

mod acked;
mod cluster;
mod failover;
mod guard;
mod load;
mod replies;
mod resend;

use std::future::Future;
use std::time::{Duration, Instant};

use lease_conformance::fixtures::{required, RedisOptions, RedisServer, REDIS_HINT};
use lease_core::{Error, RunId, Ttl, WorkerId};
use lease_redis::{RedisConfig, RedisLeaseStore};

/// A private server started with `options`, or the test fails saying what to install.
fn server(options: RedisOptions) -> Option<RedisServer> {
    required(
        "redis-server",
        RedisServer::start_options(options),
        REDIS_HINT,
    )
}

/// The config of `url` in namespace `ns`, with timeouts short enough for tests.
fn config(url: &str, ns: &str) -> RedisConfig {
    RedisConfig::from_url(url)
        .with_namespace(ns)
        .with_response_timeout(Duration::from_millis(1_500))
        .with_connect_timeout(Duration::from_millis(500))
}

/// A store on `url` in namespace `ns`.
async fn connect(url: &str, ns: &str) -> lease_core::Result<RedisLeaseStore> {
    RedisLeaseStore::connect(config(url, ns)).await
}

/// A plain connection to `url`, for looking behind the adapter.
async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection_with_config(
            // A server busy with an fsync must not fail the test's own reads (the default is 500 ms).
            &redis::AsyncConnectionConfig::new()
                .set_response_timeout(Some(std::time::Duration::from_secs(30))),
        )
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"))
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

/// Lower-case hex of a run id: its field in the namespace's runs hash.
fn hex(id: &str) -> String {
    id.bytes().map(|b| format!("{b:02x}")).collect()
}

/// Asserts `err` is [`Error::Misconfigured`] from redis, not retryable, and that its message
/// contains `needle`.
#[track_caller]
fn assert_misconfigured(err: &Error, needle: &str) {
    assert!(
        matches!(
            err,
            Error::Misconfigured {
                backend: "redis",
                ..
            }
        ),
        "expected a redis configuration error naming {needle:?}, got {err:?}"
    );
    assert!(!err.is_retryable(), "{err:?}");
    assert!(
        err.to_string().contains(needle),
        "the message should name {needle:?}: {err}"
    );
}

/// Retries `op` while it fails with a retryable error, until `within` has passed.
async fn retrying<T, F, Fut>(within: Duration, what: &str, mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = lease_core::Result<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        match op().await {
            Ok(value) => return value,
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("{what}: {e:?}"),
        }
    }
}

/// Prints past the test harness's output capture, so a run shows the fences it observed.
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}
