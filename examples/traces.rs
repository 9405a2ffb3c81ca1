//! One trace from the request that enqueues a job to the handler that runs it (feature `otel`).
//!
//! ```sh
//! cargo run -p distribution --features otel --example traces                 # embedded store
//! LEASE_STORE=postgres://… cargo run -p distribution --features otel --example traces
//! ```
//!
//! A service installs `tracing-opentelemetry`'s layer over its OpenTelemetry tracer (here the
//! SDK's in-memory exporter, so the example can check what it exports; a service would use
//! OTLP). Then:
//! - a typed insert inside a span (the "checkout" request) stores that span's W3C
//!   `traceparent` with the run;
//! - the Worker's `job` span for the attempt is that span's child, in the same trace, and the
//!   handler's own spans are children of the `job` span;
//! - the process that runs the job need not be the one that enqueued it: the context travels
//!   in the store.
//!
//! It prints the trace as a tree and exits 0 only if it is one trace.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use distribution::{
    connect, BoxError, CancellationToken, Config, End, InsertExt, InsertOpts, JobArgs, Kinds,
    RunContext, RunState, Ttl, Worker, WorkerConfig, WorkerId,
};
use opentelemetry::trace::{SpanId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde::{Deserialize, Serialize};
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

#[derive(Serialize, Deserialize)]
struct ShipOrder {
    order: u64,
}

impl JobArgs for ShipOrder {
    const KIND: &'static str = "ship-order";
}

// One thread: the subscriber is installed for this thread, where the worker's tasks run too.
// A service installs it globally (`tracing::subscriber::set_global_default`).
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match trace().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("traces: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn trace() -> Result<(), BoxError> {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("shop")));
    let _installed = tracing::subscriber::set_default(subscriber);

    let mut config = Config::load(None)?;
    if config.store.is_empty() {
        config = config.with_store("memory:");
    }
    if config.namespace.is_none() {
        config = config.with_namespace(format!("example_traces_{}", std::process::id()));
    }
    let store = connect(&config).await?;

    // The request handler: it enqueues the shipment inside its span.
    let inserted = async {
        store
            .insert(&ShipOrder { order: 7 }, InsertOpts::new())
            .await
    }
    .instrument(tracing::info_span!("POST /checkout"))
    .await?;
    let stored = store.inspect(&inserted.run_id).await?.trace_parent;
    println!(
        "enqueued {} under traceparent {}",
        inserted.run_id,
        stored.as_ref().map_or("(none)", |p| p.as_str())
    );

    // The worker: the attempt's span continues the request's trace.
    let kinds =
        Kinds::new().job::<ShipOrder, _, _>(|_ctx: RunContext, ship: ShipOrder| async move {
            tracing::info_span!("book courier", order = ship.order).in_scope(|| ());
            Ok(End::Complete)
        });
    let worker = Worker::new(
        Arc::clone(&store),
        WorkerId::new("shipper")?,
        WorkerConfig::new(Ttl::from_secs(10)?).with_poll_interval(Duration::from_millis(20)),
    )?;
    let shutdown = CancellationToken::new();
    let serving = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { worker.run_kinds(kinds, shutdown).await }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while store.inspect(&inserted.run_id).await?.state != RunState::Completed {
        if tokio::time::Instant::now() > deadline {
            return Err("the shipment was not completed within 20 s".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    shutdown.cancel();
    serving.await??;
    provider.force_flush()?;

    let spans = exporter.get_finished_spans()?;
    let find = |name: &str| spans.iter().find(|s| s.name == name);
    let (Some(request), Some(job), Some(courier)) =
        (find("POST /checkout"), find("job"), find("book courier"))
    else {
        return Err(format!("missing spans: {:?}", names(&spans)).into());
    };
    print_tree(&spans, request, 0);
    let trace = request.span_context.trace_id();
    if job.span_context.trace_id() != trace || courier.span_context.trace_id() != trace {
        return Err("the handler's spans are not in the request's trace".into());
    }
    if job.parent_span_id != request.span_context.span_id()
        || courier.parent_span_id != job.span_context.span_id()
    {
        return Err("the spans are not request > job > book courier".into());
    }
    if stored.is_none_or(|p| p.trace_id() != trace.to_string()) {
        return Err("the run does not carry the request's traceparent".into());
    }
    println!("one trace: {trace}");
    Ok(())
}

fn names(spans: &[SpanData]) -> Vec<String> {
    spans.iter().map(|s| s.name.to_string()).collect()
}

fn print_tree(spans: &[SpanData], at: &SpanData, depth: usize) {
    println!(
        "{:indent$}{} (span {})",
        "",
        at.name,
        at.span_context.span_id(),
        indent = depth * 2
    );
    let id: SpanId = at.span_context.span_id();
    for child in spans.iter().filter(|s| s.parent_span_id == id) {
        print_tree(spans, child, depth + 1);
    }
}
