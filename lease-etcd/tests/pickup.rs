//! Pickup on etcd, as `lease-bench --parts pickup` measures it on Postgres and Redis: how
//! long a run created on an idle fleet waits for its handler, and the empty claims an idle
//! fleet sends, with the store's wake-ups (its watch) against polling (`without_wake_ups`),
//! in one run on a private three-member cluster on loopback (figures in BENCHMARKS.md):
//! `cargo test --release -p lease-etcd --test pickup -- --ignored --nocapture`.
//!
//! Each worker has a store of its own (one watch each), as the processes of a fleet would.

use std::sync::Arc;
use std::time::Duration;

use lease_conformance::fixtures::etcd::{EtcdCluster, MEMBERS};
use lease_conformance::spawn_reporting_worker;
use lease_core::{LeaseStore, Result, RunId, Ttl, WorkerId};
use lease_etcd::{EtcdConfig, EtcdLeaseStore};
use lease_runtime::{CancellationToken, WorkerConfig, WorkerReport};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

struct Fleet {
    shutdown: CancellationToken,
    workers: Vec<JoinHandle<Result<WorkerReport>>>,
    started: mpsc::UnboundedReceiver<(RunId, Instant)>,
    creator: Arc<dyn LeaseStore>,
}

async fn fleet(endpoints: &[String], prefix: &str, n: usize, wake: bool) -> Fleet {
    let shutdown = CancellationToken::new();
    let (tx, started) = mpsc::unbounded_channel();
    let mut workers = Vec::with_capacity(n);
    let mut creator = None;
    for i in 0..n {
        let store: Arc<dyn LeaseStore> = Arc::new(
            EtcdLeaseStore::connect(EtcdConfig::new(endpoints.to_vec(), prefix).unwrap())
                .await
                .unwrap(),
        );
        creator.get_or_insert_with(|| store.clone());
        let mut config = WorkerConfig::new(Ttl::from_secs(30).unwrap());
        if !wake {
            config = config.without_wake_ups();
        }
        workers.push(
            spawn_reporting_worker(
                store,
                WorkerId::new(format!("pickup-{i}")).unwrap(),
                config,
                tx.clone(),
                shutdown.clone(),
            )
            .unwrap(),
        );
    }
    Fleet {
        shutdown,
        workers,
        started,
        creator: creator.unwrap(),
    }
}

impl Fleet {
    async fn stop(self) -> Vec<WorkerReport> {
        self.shutdown.cancel();
        let mut reports = Vec::new();
        for w in self.workers {
            reports.push(w.await.unwrap().unwrap());
        }
        reports
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

/// (p50, p99, max) ms of `runs` pickups, and the idle empty claims per worker per second over
/// `quiet` (a settle-only fleet's totals subtracted).
async fn measure(endpoints: &[String], n: usize, wake: bool, runs: usize) -> (f64, f64, f64, f64) {
    let tag = format!("pickup-{n}-{wake}");
    let mut busy = fleet(endpoints, &tag, n, wake).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut ms = Vec::with_capacity(runs);
    for i in 0..runs {
        let id = RunId::new(format!("pickup-{i:04}")).unwrap();
        let sent = Instant::now();
        busy.creator.create(&id).await.unwrap();
        let (ran, at) = tokio::time::timeout(Duration::from_secs(30), busy.started.recv())
            .await
            .expect("started within 30 s")
            .expect("the fleet runs");
        assert_eq!(ran, id);
        ms.push((at - sent).as_secs_f64() * 1000.0);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let reports = busy.stop().await;
    assert_eq!(
        reports.iter().map(|r| r.completed).sum::<u64>(),
        runs as u64
    );
    if wake {
        assert!(reports.iter().map(|r| r.wake_ups).sum::<u64>() > 0);
    }
    let quiet = Duration::from_secs(5);
    let mut polls = [0u64; 2];
    for (slot, window) in [(0, Duration::from_secs(2)), (1, Duration::from_secs(7))] {
        let idle = fleet(endpoints, &format!("idle-{n}-{wake}-{slot}"), n, wake).await;
        tokio::time::sleep(window).await;
        polls[slot] = idle.stop().await.iter().map(|r| r.empty_polls).sum();
    }
    let idle = polls[1].saturating_sub(polls[0]) as f64 / n as f64 / quiet.as_secs_f64();
    ms.sort_by(f64::total_cmp);
    (
        percentile(&ms, 0.5),
        percentile(&ms, 0.99),
        *ms.last().unwrap(),
        idle,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: starts a three-member etcd cluster and runs fleets of up to 16 workers for about two minutes; run with --release -- --ignored --nocapture"]
async fn pickup_with_wake_ups_against_polling() {
    let cluster = EtcdCluster::start().expect("an etcd cluster");
    let endpoints: Vec<String> = (0..MEMBERS).map(|i| cluster.endpoint(i)).collect();
    println!("etcd pickup (create → handler start; idle = empty claims per worker per second)");
    println!("| workers | mode | p50 ms | p99 ms | max ms | idle/s |");
    println!("|--:|---|--:|--:|--:|--:|");
    for n in [1, 16] {
        for wake in [true, false] {
            let (p50, p99, max, idle) = measure(&endpoints, n, wake, 20).await;
            let mode = if wake { "wake-ups" } else { "polling" };
            println!("| {n} | {mode} | {p50:.1} | {p99:.1} | {max:.1} | {idle:.2} |");
        }
    }
}
