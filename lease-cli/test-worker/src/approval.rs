//! `lease-test-worker approval`: a library `Worker` serving kind `approval` with a two-wait
//! workflow, the program the signals' whole-system test drives (`tests/it_signals.rs`).
//!
//! Its handler, for each claim:
//! - a run that waited for nothing yet: takes the token of a wait for `approval`, prints a
//!   `waiting` event with it, and ends waiting for `approval`;
//! - resumed by an `approval` signal: prints `approved` with the payload and the fence, then
//!   waits for `shipped` the same way;
//! - resumed by a `shipped` signal: prints `shipped` and completes;
//! - resumed by a timeout: prints `timed_out` and completes.
//!
//! It exits once `--ends N` ends were committed (or on SIGTERM), after a graceful shutdown.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distribution::{
    connect, CancellationToken, Config, End, EndReport, Kind, Kinds, RunContext, Worker,
    WorkerConfig, WorkerId,
};
use serde_json::json;

use crate::worker::Events;
use lease_cli::Failure;

/// Arguments of `lease-test-worker approval`.
#[derive(clap::Args)]
pub(crate) struct ApprovalArgs {
    /// This worker's id.
    #[arg(long = "id")]
    id: String,
    /// Exit after this many ends were committed.
    #[arg(long, value_name = "N")]
    ends: usize,
    /// How long each wait lasts, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 60_000)]
    wait_ms: u64,
}

pub(crate) async fn run(config: &Config, args: ApprovalArgs) -> Result<(), Failure> {
    let store = connect(config).await?;
    let events = Events::stdout();
    let timeout = Duration::from_millis(args.wait_ms);
    let shutdown = CancellationToken::new();
    let ended = Arc::new(AtomicUsize::new(0));
    let worker = Worker::new(
        store,
        WorkerId::new(args.id)?,
        WorkerConfig::new(config.ttl).with_grace(Duration::from_secs(2)),
    )?
    .on_end({
        let (events, shutdown, ended, limit) =
            (events.clone(), shutdown.clone(), ended.clone(), args.ends);
        move |end: &EndReport<'_>| {
            let fields = json!({"run": end.lease.run().as_str(), "fence": end.lease.fence().get(),
                                "end": end.end.as_str(), "ok": end.result.is_ok()});
            events.emit("ended", fields);
            if ended.fetch_add(1, Ordering::SeqCst) + 1 >= limit {
                shutdown.cancel();
            }
        }
    });
    let kinds = Kinds::new().handle(Kind::new("approval")?, move |ctx: RunContext| {
        let events = events.clone();
        async move {
            let (run, fence) = (ctx.run().to_string(), ctx.fence().get());
            let wait = |name: &str| -> Result<End, distribution::BoxError> {
                let token = ctx.signal_token(name)?;
                events.emit(
                    "waiting",
                    json!({"run": run, "fence": fence, "signal": name, "token": token.to_string()}),
                );
                Ok(End::await_signal(name, timeout)?)
            };
            if let Some(signal) = ctx.signal("approval") {
                let payload = String::from_utf8_lossy(signal.payload());
                events.emit(
                    "approved",
                    json!({"run": run, "fence": fence, "payload": payload, "wait_fence": signal.fence.get()}),
                );
                return wait("shipped");
            }
            if let Some(signal) = ctx.signal("shipped") {
                let payload = String::from_utf8_lossy(signal.payload());
                events.emit(
                    "shipped",
                    json!({"run": run, "fence": fence, "payload": payload}),
                );
                return Ok(End::Complete);
            }
            if let Some(end) = ctx.resumed().filter(|_| ctx.signal("approval").is_none()) {
                events.emit(
                    "timed_out",
                    json!({"run": run, "fence": fence, "signal": end.name().as_str()}),
                );
                return Ok(End::Complete);
            }
            wait("approval")
        }
    });
    let stop = shutdown.clone();
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            term.recv().await;
            stop.cancel();
        }
    });
    worker.run_kinds(kinds, shutdown).await?;
    Ok(())
}
