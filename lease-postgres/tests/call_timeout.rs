//! Every call has a client-side bound. With the link to the server blackholed (iptables drops
//! every packet, nothing is reset: TCP alone would wait about 15 minutes), each store call
//! fails with a retryable `Unavailable` within the call timeout, and a `Worker` asked to shut
//! down returns within its grace plus one call timeout. After the heal the same store works.
//!
//! These tests start their own servers. A server that cannot be started fails the test;
//! `LEASE_TEST_SKIP_SERVERS=1` skips instead.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_conformance::fixtures::{
    required, unique_namespace, with_params, LinkCut, PostgresServer, LINK_CUT_HINT,
};
use lease_core::{End, Ending, LeaseStore, ListFilter};
use lease_postgres::{PostgresConfig, PostgresLeaseStore};
use lease_runtime::CancellationToken;
use lease_runtime::{RunContext, Worker, WorkerConfig};

mod support;
use support::{id, or_fail, ttl, worker};

/// The address the store reaches the server through; cutting it cuts the store alone.
const VIA: &str = "127.0.0.3";
const CALL_TIMEOUT: Duration = Duration::from_millis(1_000);

async fn store_via(server: &PostgresServer) -> Arc<PostgresLeaseStore> {
    let url = with_params(
        &server.url_via(VIA),
        &format!("call_timeout_ms={}", CALL_TIMEOUT.as_millis()),
    );
    Arc::new(
        PostgresLeaseStore::connect(
            PostgresConfig::from_url(url)
                .with_schema(unique_namespace("blackhole"))
                .with_max_connections(4),
        )
        .await
        .unwrap(),
    )
}

/// How long `call` took and what it answered, failing the test if it outlives `limit`.
async fn timed<T: std::fmt::Debug>(
    what: &str,
    limit: Duration,
    call: impl std::future::Future<Output = lease_core::Result<T>>,
) -> (Duration, lease_core::Result<T>) {
    let started = Instant::now();
    let answer = tokio::time::timeout(limit, call)
        .await
        .unwrap_or_else(|_| panic!("{what} was still waiting after {limit:?}"));
    (started.elapsed(), answer)
}

/// Each operation on a blackholed connection answers a retryable `Unavailable` within the
/// call timeout (1 s here), whether it finds a pooled connection that stopped answering or has
/// to open a new one; once the link heals the same store serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_on_a_blackholed_link_fails_within_the_call_timeout() {
    let Some(server) = or_fail(PostgresServer::start(), "a postgres server") else {
        return;
    };
    let store = store_via(&server).await;
    let (r, s) = (id("r"), id("s"));
    store.create(&r).await.unwrap();
    store.create(&s).await.unwrap();
    let lease = store.claim(&r, &worker("a"), ttl(60_000)).await.unwrap();

    let Some(cut) = required(
        "iptables",
        LinkCut::cut_to(VIA, server.port()),
        LINK_CUT_HINT,
    ) else {
        return;
    };
    let limit = CALL_TIMEOUT * 3;
    let store_ref: &PostgresLeaseStore = &store;
    let mut seen = Vec::new();
    macro_rules! check {
        ($what:literal, $call:expr) => {{
            let (took, answer) = timed($what, limit, $call).await;
            let err = answer.expect_err(concat!($what, " answered on a cut link"));
            assert!(err.is_retryable(), "{}: {err:?}", $what);
            assert!(
                took <= CALL_TIMEOUT + Duration::from_millis(500),
                "{} took {took:?}",
                $what
            );
            seen.push(format!("{} {:?}", $what, took));
        }};
    }
    check!("inspect", store_ref.inspect(&r));
    check!("renew", store_ref.renew(&lease));
    check!("append", store_ref.append(&lease, b"effect"));
    check!("claim", store_ref.claim(&s, &worker("b"), ttl(60_000)));
    check!(
        "claim_next",
        store_ref.claim_next(&worker("b"), ttl(60_000), 10)
    );
    check!(
        "end_many",
        store_ref.end_many(&[Ending::new(lease.clone(), End::Complete)])
    );
    check!("complete", store_ref.complete(&lease));
    check!("list", store_ref.list(&ListFilter::default()));
    check!("journal", store_ref.journal(&r));
    check!("create", store_ref.create(&id("t")));
    check!("fenced_transaction", async {
        store_ref.fenced_transaction(&lease).await.map(drop)
    });
    eprintln!(
        "blackholed link, call timeout {CALL_TIMEOUT:?}: {}",
        seen.join(", ")
    );

    drop(cut);
    let deadline = Instant::now() + Duration::from_secs(10);
    let record = loop {
        match store.inspect(&r).await {
            Ok(record) => break record,
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("the store did not recover after the heal: {e:?}"),
        }
    };
    assert_eq!(record.fence, lease.fence());
    store.renew(&lease).await.unwrap();
}

/// A `Worker` running jobs when its link is blackholed, then asked to shut down, returns
/// within its grace plus one call timeout: its heartbeats, its claim in flight and the ends of
/// its jobs each give up at the call timeout, and the shutdown makes one last attempt only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_shuts_down_within_its_grace_and_one_call_timeout_on_a_blackholed_link() {
    let Some(server) = or_fail(PostgresServer::start(), "a postgres server") else {
        return;
    };
    let store = store_via(&server).await;
    let runs: Vec<_> = (0..3).map(|i| id(&format!("job-{i}"))).collect();
    store.create_many(&runs).await.unwrap();
    let grace = Duration::from_millis(500);
    let pool = Worker::new(
        store.clone() as Arc<dyn LeaseStore>,
        worker("w"),
        WorkerConfig::new(ttl(10_000))
            .with_concurrency(4)
            .with_poll_interval(Duration::from_millis(20))
            .with_grace(grace),
    )
    .unwrap();
    let started = Arc::new(tokio::sync::Semaphore::new(0));
    let handler = {
        let started = started.clone();
        move |ctx: RunContext| {
            let started = started.clone();
            async move {
                started.add_permits(1);
                // Works until told to stop (the shutdown's grace ends, or the lease is lost).
                ctx.cancelled().await;
                Ok(End::Complete)
            }
        }
    };
    let shutdown = CancellationToken::new();
    let running = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move { pool.run(handler, shutdown).await })
    };
    let all = tokio::time::timeout(Duration::from_secs(10), started.acquire_many(3))
        .await
        .expect("the worker started its three jobs");
    drop(all);

    let Some(_cut) = required(
        "iptables",
        LinkCut::cut_to(VIA, server.port()),
        LINK_CUT_HINT,
    ) else {
        return;
    };
    // A claim and heartbeats are in flight on the dead link by now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let asked = Instant::now();
    shutdown.cancel();
    let report = tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("Worker::run never returned")
        .unwrap();
    let took = asked.elapsed();
    eprintln!(
        "worker shutdown on a blackholed link: returned after {took:?} (grace {grace:?}, call \
         timeout {CALL_TIMEOUT:?}): {report:?}"
    );
    let report = report.expect("the worker stops with a report");
    assert_eq!(report.started, 3);
    assert!(
        took <= grace + CALL_TIMEOUT + Duration::from_millis(500),
        "Worker::run took {took:?} to return"
    );
}

/// The calls that run on a connection of the caller's, and a fenced transaction's own end, are
/// bounded like every other: with the link blackholed, `fence_in`, `end_in`, `create_in` and
/// `create_many_in` in the caller's open transactions, and a fenced transaction's `rollback`
/// and `commit`, each answer a retryable `Unavailable` within the call timeout (before, each
/// waited for TCP to give up, about 15 minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_in_the_callers_transactions_and_a_fenced_transactions_end_are_bounded() {
    use lease_postgres::sqlx;
    let Some(server) = or_fail(PostgresServer::start(), "a postgres server") else {
        return;
    };
    let store = store_via(&server).await;
    let (r, s) = (id("r"), id("s"));
    store.create(&r).await.unwrap();
    store.create(&s).await.unwrap();
    let lease = store.claim(&r, &worker("a"), ttl(60_000)).await.unwrap();
    let other = store.claim(&s, &worker("a"), ttl(60_000)).await.unwrap();
    // The caller's own pool, through the address that is cut.
    let plain = server.url_via(VIA).split('?').next().unwrap().to_owned();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .connect(&plain)
        .await
        .unwrap();
    let mut txs = Vec::new();
    for _ in 0..4 {
        let mut tx = pool.begin().await.unwrap();
        sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
        txs.push(tx);
    }
    let rolled_back = store.fenced_transaction(&lease).await.unwrap();
    // The fenced transactions hold the rows, so each of the caller's statements below would
    // wait for them too; the cut comes first.
    let committed = store.fenced_transaction(&other).await.unwrap();

    let Some(_cut) = required(
        "iptables",
        LinkCut::cut_to(VIA, server.port()),
        LINK_CUT_HINT,
    ) else {
        return;
    };
    let limit = CALL_TIMEOUT * 3;
    let mut seen = Vec::new();
    let mut txs = txs.into_iter();
    let mut next = || txs.next().unwrap();
    macro_rules! check {
        ($what:literal, $call:expr) => {{
            let (took, answer) = timed($what, limit, $call).await;
            let err = answer.expect_err(concat!($what, " answered on a cut link"));
            assert!(err.is_retryable(), "{}: {err:?}", $what);
            assert!(
                took <= CALL_TIMEOUT + Duration::from_millis(500),
                "{} took {took:?}",
                $what
            );
            seen.push(format!("{} {:?}", $what, took));
        }};
    }
    let mut tx = next();
    check!("fence_in", store.fence_in(&mut tx, &lease));
    let mut tx = next();
    check!("end_in", store.end_in(&mut tx, &lease, End::Complete));
    let mut tx = next();
    check!("create_in", store.create_in(&mut tx, &id("t")));
    let mut tx = next();
    check!(
        "create_many_in",
        store.create_many_in(&mut tx, &[id("u"), id("v")])
    );
    check!("fenced rollback", rolled_back.rollback());
    check!("fenced commit", committed.commit());
    eprintln!(
        "blackholed link, call timeout {CALL_TIMEOUT:?}: {}",
        seen.join(", ")
    );
}
