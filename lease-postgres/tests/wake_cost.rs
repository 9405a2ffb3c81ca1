//! What wake-ups cost the writes that make runs claimable (figures in BENCHMARKS.md):
//! `cargo test --release -p lease-postgres --test wake_cost -- --ignored --nocapture`.
//!
//! Creates and claim → release cycles from 16 concurrent tasks, through a store with wake-ups
//! (its notifier sends its writes' notifications after they commit, coalesced) and one without
//! (`wake_ups=false`: nothing notified) in turn, three rounds of each, alternating, same server
//! and schema, while another store of the schema listens (as a fleet's workers do). Until the
//! notifier, each of these writes notified inside its own transaction, through the trigger: a
//! transaction that notifies takes a server-wide lock at its commit and holds it through the
//! flush, so notifying commits queued behind one another (0.25× the creates and 0.43× the
//! cycles of a store without wake-ups, on a durable server). Completions and renewals notify
//! nothing and are not measured. Ignored in `cargo test`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_conformance::fixtures::{postgres_url, unique_namespace};
use lease_core::{LeaseStore, RunId, Ttl, WorkerId};
use lease_postgres::{PostgresConfig, PostgresLeaseStore};

const TASKS: usize = 16;
const PER_TASK: usize = 300;

/// Creates/s of `TASKS` tasks each creating `PER_TASK` runs named after `round`.
async fn creates(store: &Arc<PostgresLeaseStore>, round: &str) -> f64 {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (store, round) = (store.clone(), round.to_owned());
        tasks.push(tokio::spawn(async move {
            for i in 0..PER_TASK {
                let run = RunId::new(format!("{round}-{t:02}-{i:04}")).unwrap();
                store.create(&run).await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    (TASKS * PER_TASK) as f64 / started.elapsed().as_secs_f64()
}

/// Claim → release cycles/s of `TASKS` tasks, each on a run of its own (`cycle-{t}`).
async fn releases(store: &Arc<PostgresLeaseStore>) -> f64 {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let run = RunId::new(format!("cycle-{t:02}")).unwrap();
            let worker = WorkerId::new(format!("w{t}")).unwrap();
            for _ in 0..PER_TASK {
                let lease = store
                    .claim(&run, &worker, Ttl::from_secs(30).unwrap())
                    .await
                    .unwrap();
                store.release(&lease).await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    (TASKS * PER_TASK) as f64 / started.elapsed().as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: about 60,000 writes; run with --release -- --ignored --nocapture"]
async fn what_wake_ups_cost_creates_and_releases() {
    let Some(url) = postgres_url().await else {
        return;
    };
    let schema = unique_namespace("wake_cost");
    let config = PostgresConfig::from_url(url)
        .with_schema(&schema)
        .with_max_connections(TASKS as u32);
    let store = Arc::new(PostgresLeaseStore::connect(config.clone()).await.unwrap());
    // A listener of the schema's channel, as a worker's store keeps.
    let listener = PostgresLeaseStore::connect(config.clone()).await.unwrap();
    let wakes = listener.wakes().unwrap();
    let rx = wakes.subscribe();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !rx.is_live() {
        assert!(Instant::now() < deadline, "the listener did not start");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for t in 0..TASKS {
        store
            .create(&RunId::new(format!("cycle-{t:02}")).unwrap())
            .await
            .unwrap();
    }
    let silent = Arc::new(
        PostgresLeaseStore::connect(config.with_wake_ups(false))
            .await
            .unwrap(),
    );
    let mut rows: Vec<(bool, f64, f64)> = Vec::new();
    for round in 0..3 {
        for on in [true, false] {
            let writer = if on { &store } else { &silent };
            let c = creates(writer, &format!("r{round}-{on}")).await;
            let r = releases(writer).await;
            rows.push((on, c, r));
        }
    }
    println!("| round | wake-ups | creates/s | claim → release cycles/s |");
    println!("|--:|---|--:|--:|");
    for (i, (on, c, r)) in rows.iter().enumerate() {
        let state = if *on { "on" } else { "off" };
        println!("| {} | {state} | {c:.0} | {r:.0} |", i / 2 + 1);
    }
    let mean = |on: bool, pick: fn(&(bool, f64, f64)) -> f64| {
        let xs: Vec<f64> = rows.iter().filter(|r| r.0 == on).map(pick).collect();
        xs.iter().sum::<f64>() / xs.len() as f64
    };
    println!(
        "on / off: creates {:.2}×, claim → release cycles {:.2}× (means of three rounds)",
        mean(true, |r| r.1) / mean(false, |r| r.1),
        mean(true, |r| r.2) / mean(false, |r| r.2)
    );
    drop(rx);
}
