//! `replicas=N` on a primary whose replica's link is cut (a real partition, by iptables):
//! nothing is reported done that the promoted replica does not hold, a retry's "already ended
//! under your fence" included, and reads are not held up behind writes waiting for replicas.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lease_conformance::assert_unavailable;
use lease_conformance::fixtures::{
    required, unique_namespace, LinkCut, RedisOptions, RedisServer, LINK_CUT_HINT,
};
use lease_core::{End, LeaseStore, RunScope, RunState, ScopeConfig, Worker, WorkerConfig};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{connect, raw, run, say, server, ttl, worker};

/// A primary, and its replica replicating from `link` (an address only that link uses), in
/// sync.
fn primary_and_replica(link: &str) -> Option<(RedisServer, RedisServer)> {
    let primary = server(RedisOptions::default())?;
    let replica = server(
        RedisOptions::default()
            .with_replicaof(primary.port())
            .with_source_address(link),
    )?;
    replica
        .wait_synced_to(&primary, Duration::from_secs(10))
        .unwrap();
    Some((primary, replica))
}

/// Cuts the replica's link and proves it is cut: after a write, `WAIT 1 300` answers 0.
async fn cut_link(primary: &RedisServer, link: &str) -> Option<LinkCut> {
    let cut = required(
        "iptables",
        LinkCut::cut(link, primary.port()),
        LINK_CUT_HINT,
    )?;
    let mut conn = raw(&primary.url()).await;
    let _: i64 = redis::cmd("INCR")
        .arg("link-probe")
        .query_async(&mut conn)
        .await
        .unwrap();
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(300)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        acked, 0,
        "the replica still acknowledges: the link is not cut"
    );
    Some(cut)
}

/// SIGKILLs the primary and promotes the replica (`REPLICAOF NO ONE`), as a failover would.
fn fail_over(primary: &mut RedisServer, replica: &RedisServer) {
    primary.stop();
    replica.command(&["REPLICAOF", "NO", "ONE"]).unwrap();
    assert_eq!(replica.info("replication", "role").unwrap(), "master");
}

/// With `replicas=1&replica_timeout_ms=300` and the replica cut off, a `Worker` completing a
/// job reports it committed only if the replica has it: its first `end_many` is not
/// acknowledged, and its retries answer "already completed under your fence", which must be
/// confirmed like the first write (a barrier and `WAIT` on the same connection) and is not.
/// After the primary is SIGKILLed and the replica promoted, every run the Worker reported
/// committed is `Completed` there. A job completed before the cut is the control: reported
/// committed, and completed on the replica. The same for `complete` called directly and
/// retried, and for a `RunScope`'s complete and its retry.
#[tokio::test]
async fn nothing_reported_committed_is_missing_after_the_replica_is_promoted() {
    const LINK: &str = "127.0.0.7";
    let Some((mut primary, replica)) = primary_and_replica(LINK) else {
        return;
    };
    let ns = unique_namespace("acked");
    let url = format!("{}?replicas=1&replica_timeout_ms=300", primary.url());
    let store: Arc<dyn LeaseStore> = Arc::new(connect(&url, &ns).await.unwrap());

    // Claimed while the replica follows: these leases are on the replica.
    let (direct, scoped) = (run("direct"), run("scoped"));
    store.create(&direct).await.unwrap();
    store.create(&scoped).await.unwrap();
    let direct_lease = store
        .claim(&direct, &worker("d"), ttl(60_000))
        .await
        .unwrap();
    let scope = RunScope::claim(
        store.clone(),
        &scoped,
        &worker("s"),
        ttl(60_000),
        ScopeConfig::default(),
    )
    .await
    .unwrap();

    // The Worker: "before" completes at once, "during" waits for the cut.
    let cut_made = Arc::new(Notify::new());
    let started = Arc::new(Notify::new());
    let reports: Arc<Mutex<Vec<(String, u64, bool)>>> = Arc::default();
    let config = WorkerConfig::new(ttl(3_000))
        .with_concurrency(2)
        .with_poll_interval(Duration::from_millis(20))
        .with_batch(10, Duration::from_millis(5));
    let seen = reports.clone();
    let pool = Worker::new(store.clone(), worker("w"), config)
        .unwrap()
        .on_end(move |report| {
            seen.lock().unwrap().push((
                report.lease.run().to_string(),
                report.lease.fence().get(),
                report.result.is_ok(),
            ));
        });
    let handler = {
        let (cut_made, started) = (cut_made.clone(), started.clone());
        move |ctx: lease_core::RunContext| {
            let (cut_made, started) = (cut_made.clone(), started.clone());
            async move {
                if ctx.run().as_str() == "during" {
                    started.notify_one();
                    cut_made.notified().await;
                }
                Ok(End::CompleteWith(
                    format!("effect of {}", ctx.run()).into_bytes(),
                ))
            }
        }
    };
    let shutdown = CancellationToken::new();
    let running = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move { pool.run(handler, shutdown).await })
    };
    store.create(&run("before")).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !reports
        .lock()
        .unwrap()
        .iter()
        .any(|(r, _, _)| r == "before")
    {
        assert!(Instant::now() < deadline, "'before' was never reported");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    store.create(&run("during")).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), started.notified())
        .await
        .expect("the worker started 'during'");

    let Some(cut) = cut_link(&primary, LINK).await else {
        return;
    };
    cut_made.notify_one();
    // The Worker retries the end while the lease is younger than its TTL (3 s), then reports.
    let deadline = Instant::now() + Duration::from_secs(15);
    while !reports
        .lock()
        .unwrap()
        .iter()
        .any(|(r, _, _)| r == "during")
    {
        assert!(Instant::now() < deadline, "'during' was never reported");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // complete, called directly, then retried after the unanswered first attempt.
    let first = store.complete(&direct_lease).await.unwrap_err();
    assert_unavailable(&first, "redis");
    let retried = store.complete(&direct_lease).await.unwrap_err();
    assert!(
        retried.is_retryable() && retried.to_string().contains("replicas"),
        "a retry's 'already completed' must wait for the replica too, got {retried:?}"
    );
    // The scope's complete, and its retry (which would take "already completed" for success).
    let first = scope.complete().await.unwrap_err();
    assert_unavailable(&first, "redis");
    let retried = scope.complete().await;
    assert!(
        matches!(&retried, Err(e) if e.is_retryable()),
        "the scope's retried complete reported {retried:?} without the replica"
    );

    shutdown.cancel();
    let report = tokio::time::timeout(Duration::from_secs(15), running)
        .await
        .expect("the worker stops")
        .unwrap()
        .unwrap();
    fail_over(&mut primary, &replica);
    drop(cut);

    let promoted = connect(&replica.url(), &ns).await.unwrap();
    let reports = reports.lock().unwrap().clone();
    let mut seen = Vec::new();
    for (name, fence, committed) in &reports {
        let record = promoted.inspect(&run(name)).await.unwrap();
        seen.push(format!(
            "{name}: reported {} under fence {fence}; on the promoted replica {} at fence {}",
            if *committed {
                "committed"
            } else {
                "not committed"
            },
            record.state,
            record.fence
        ));
        if *committed {
            assert_eq!(
                record.state,
                RunState::Completed,
                "{name} was reported committed but the promoted replica has {record:?}"
            );
        }
    }
    for (name, lease_fence) in [("direct", direct_lease.fence()), ("scoped", scope.fence())] {
        let record = promoted.inspect(&run(name)).await.unwrap();
        assert_eq!(record.fence, lease_fence, "{name}");
        seen.push(format!(
            "{name}: complete refused twice; on the promoted replica {} at fence {}",
            record.state, record.fence
        ));
    }
    say(&format!(
        "replicas=1, replica cut off, then promoted: {}; worker {report:?}",
        seen.join("; ")
    ));
    assert!(
        reports.iter().any(|(r, _, ok)| r == "before" && *ok),
        "the control job before the cut was committed: {reports:?}"
    );
    assert!(
        reports.iter().any(|(r, _, ok)| r == "during" && !*ok),
        "the job ended during the cut cannot have been confirmed: {reports:?}"
    );
}

/// With the replica cut off and six renewals blocked in `WAIT` (`replica_timeout_ms=1000`),
/// `inspect` answers within 100 ms: reads never queue behind another call's `WAIT`, which
/// blocks its own connection only. The renewals then fail as retryable `Unavailable`.
#[tokio::test]
async fn a_frozen_replica_does_not_hold_up_reads() {
    const LINK: &str = "127.0.0.8";
    let Some((primary, _replica)) = primary_and_replica(LINK) else {
        return;
    };
    let ns = unique_namespace("readsfree");
    let url = format!("{}?replicas=1&replica_timeout_ms=1000", primary.url());
    let store = Arc::new(connect(&url, &ns).await.unwrap());
    let runs: Vec<lease_core::RunId> = (0..6).map(|i| run(&format!("r{i}"))).collect();
    store.create_many(&runs).await.unwrap();
    let leases = store
        .claim_next(&worker("a"), ttl(60_000), 6)
        .await
        .unwrap();
    assert_eq!(leases.len(), 6);

    let Some(_cut) = cut_link(&primary, LINK).await else {
        return;
    };
    let renewals: Vec<_> = leases
        .iter()
        .cloned()
        .map(|lease| {
            let store = store.clone();
            tokio::spawn(async move { store.renew(&lease).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let asked = Instant::now();
    let record = store.inspect(&runs[0]).await.unwrap();
    let took = asked.elapsed();
    assert_eq!(record.fence.get(), 1);
    let mut outcomes = Vec::new();
    for renewal in renewals {
        let err = renewal.await.unwrap().unwrap_err();
        assert_unavailable(&err, "redis");
        outcomes.push(err.is_retryable());
    }
    say(&format!(
        "replica cut off, 6 renewals waiting for it: inspect answered in {took:?}; the \
         renewals failed retryable: {outcomes:?}"
    ));
    assert!(
        took < Duration::from_millis(100),
        "inspect took {took:?} behind the renewals' WAIT"
    );
}
