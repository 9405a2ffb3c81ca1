//! The library's metrics on a Prometheus endpoint.
//!
//! ```sh
//! cargo run -p distribution --example metrics                 # memory:, this process only
//! LEASE_STORE=redis://127.0.0.1:6379 cargo run -p distribution --example metrics
//! ```
//!
//! The library reports through the [`metrics`](https://docs.rs/metrics) facade and installs no
//! exporter. This program:
//!
//! 1. installs the `metrics-exporter-prometheus` recorder and describes every series
//!    ([`observe::describe`]: help text and units);
//! 2. serves the exposition on `/metrics` on a free loopback port, with the exporter's own
//!    HTTP listener (its `http-listener` feature);
//! 3. connects the store from a [`Config`] (`LEASE_STORE`; this example alone falls back to
//!    `memory:`, written out: the library has no default store); stores from
//!    `connect` are [`Instrumented`](distribution::Instrumented), so every call is counted;
//! 4. runs a [`Worker`] over a few runs until they are completed, with the `lease_runs` and
//!    `lease_queue_lag_seconds` gauges refreshed by [`observe::spawn_counts`];
//! 5. scrapes its own endpoint over TCP, prints the `lease_*` samples, and checks that the
//!    worker series (`lease_worker_*`) and the store series (`lease_store_*`) are there,
//!    with the completions counted. It exits non-zero if they are not.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use distribution::{
    connect, observe, CancellationToken, Config, End, RunContext, RunId, Worker, WorkerConfig,
    WorkerId,
};
use metrics_exporter_prometheus::PrometheusBuilder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Runs the worker completes.
const RUNS: u64 = 20;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("metrics: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), BoxError> {
    // 1. and 2. The recorder and its endpoint. The exporter binds the address it is given and
    // does not say which port 0 became, so a free loopback port is found first.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()?;
    observe::describe();
    println!("serving http://{addr}/metrics");

    // 3. The store, instrumented by `connect`.
    let mut config = Config::load(None)?;
    if config.store.is_empty() {
        config = config.with_store("memory:");
    }
    let store = connect(&config).await?;
    let millis = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    let ids: Vec<RunId> = (0..RUNS)
        .map(|n| RunId::new(format!("metrics-{millis:x}-{n:02}")))
        .collect::<Result<_, _>>()?;
    for created in store.create_many(&ids).await? {
        created?;
    }
    // The runs gauges, from the store, every second while this program runs.
    let counts = observe::spawn_counts(store.clone(), Duration::from_secs(1));

    // 4. A worker, stopped once it completed the runs.
    let shutdown = CancellationToken::new();
    let completed = Arc::new(AtomicU64::new(0));
    let worker = Worker::new(
        store.clone(),
        WorkerId::new("metrics-example")?,
        WorkerConfig::new(config.ttl).with_concurrency(4),
    )?
    .on_end({
        let (completed, shutdown) = (completed.clone(), shutdown.clone());
        move |end| {
            if end.result.is_ok() && completed.fetch_add(1, Ordering::Relaxed) + 1 >= RUNS {
                shutdown.cancel();
            }
        }
    });
    let work = worker.run(
        |ctx: RunContext| async move {
            ctx.append(b"step 1").await?; // a fenced write: counted as a store call
            Ok(End::CompleteWith(b"done".to_vec()))
        },
        shutdown.clone(),
    );
    let report = tokio::time::timeout(Duration::from_secs(20), work)
        .await
        .map_err(|_| "the worker did not complete its runs within 20 s")??;
    println!(
        "worker: completed {}, batches {}",
        report.completed, report.batches
    );

    // 5. Scrape ourselves, as Prometheus would (after the gauges' next refresh).
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let body = scrape(addr).await?;
    counts.stop();
    let samples: Vec<&str> = body
        .lines()
        .filter(|line| line.starts_with("lease_"))
        .collect();
    // Summaries also have one line per quantile: print the counters, gauges, sums and counts.
    for line in samples.iter().filter(|line| !line.contains("quantile=")) {
        println!("{line}");
    }
    let has = |prefix: &str| samples.iter().any(|line| line.starts_with(prefix));
    for prefix in [
        observe::WORKER_ENDS,
        observe::WORKER_BATCH_SIZE,
        observe::WORKER_HANDLER_DURATION,
        observe::STORE_OPERATIONS,
        observe::STORE_DURATION,
        observe::RUNS,
        observe::QUEUE_LAG,
    ] {
        if !has(prefix) {
            return Err(format!("/metrics has no {prefix} series").into());
        }
    }
    // Every completion is counted as committed, after its batch committed.
    let committed: f64 = samples
        .iter()
        .filter(|line| {
            line.starts_with(observe::WORKER_ENDS) && line.contains("outcome=\"committed\"")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    if committed < RUNS as f64 {
        return Err(format!(
            "{} counts {committed} committed ends, not {RUNS}",
            observe::WORKER_ENDS
        )
        .into());
    }
    println!(
        "ok: {} lease_* samples on /metrics, lease_worker_* and lease_store_* among them",
        samples.len()
    );
    Ok(())
}

/// `GET /metrics` over a plain TCP connection; returns the body of a 200 answer.
async fn scrape(addr: SocketAddr) -> Result<String, BoxError> {
    let mut conn = TcpStream::connect(addr).await?;
    let request = format!("GET /metrics HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
    conn.write_all(request.as_bytes()).await?;
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(5), conn.read_to_string(&mut answer)).await??;
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or("the answer has no header end")?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!("GET /metrics answered {head:?}").into());
    }
    Ok(body.to_string())
}
