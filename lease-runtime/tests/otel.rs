//! Traces across the queue (feature `otel`): a typed insert inside a span stores that span's
//! `traceparent` with the run, and the Worker's `job` span for each attempt is that span's
//! child, in the same trace, retries included; an insert outside any span stores none. Read
//! back from OpenTelemetry's in-memory exporter.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lease_core::{BoxError, End, LeaseStore, RunState, Ttl, WorkerId};
use lease_runtime::{
    CancellationToken, InsertExt, InsertOpts, JobArgs, Kinds, MemoryLeaseStore, RetryPolicy,
    RunContext, Worker, WorkerConfig,
};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

#[derive(serde::Serialize, serde::Deserialize)]
struct Charge {
    cents: u64,
}

impl JobArgs for Charge {
    const KIND: &'static str = "charge";
}

fn named<'a>(spans: &'a [SpanData], name: &str) -> Vec<&'a SpanData> {
    spans.iter().filter(|s| s.name == name).collect()
}

// One thread: the subscriber installed for this test is the thread's, and every span of the
// worker's tasks is made on it.
#[tokio::test(flavor = "current_thread")]
async fn an_insert_and_every_attempt_of_its_handler_are_one_trace() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("lease-test")));
    let _installed = tracing::subscriber::set_default(subscriber);

    let store = Arc::new(MemoryLeaseStore::new());
    let traced = async {
        store
            .insert(&Charge { cents: 1200 }, InsertOpts::new())
            .await
    }
    .instrument(tracing::info_span!("checkout request"))
    .await
    .unwrap();
    let untraced = store
        .insert(&Charge { cents: 5 }, InsertOpts::new())
        .await
        .unwrap();
    let record = store.inspect(&traced.run_id).await.unwrap();
    let parent = record
        .trace_parent
        .clone()
        .expect("the insert's span is stored");
    assert_eq!(
        store.inspect(&untraced.run_id).await.unwrap().trace_parent,
        None
    );

    // The traced run fails its first attempt and completes on the second.
    let attempts = Arc::new(AtomicU64::new(0));
    let config = WorkerConfig::new(Ttl::from_secs(30).unwrap())
        .with_poll_interval(Duration::from_millis(10))
        .with_retry(
            RetryPolicy::default().with_backoff(Duration::from_millis(5), Duration::from_millis(5)),
        );
    let worker = Worker::new(store.clone(), WorkerId::new("w").unwrap(), config).unwrap();
    let shutdown = CancellationToken::new();
    let kinds = {
        let (traced, attempts) = (traced.run_id.clone(), attempts.clone());
        Kinds::new().job::<Charge, _, _>(move |ctx: RunContext, charge: Charge| {
            let (traced, attempts) = (traced.clone(), attempts.clone());
            async move {
                tracing::info_span!("charge card", cents = charge.cents).in_scope(|| ());
                if ctx.run() == &traced && attempts.fetch_add(1, Ordering::SeqCst) == 0 {
                    return Err::<End, BoxError>("the card network timed out".into());
                }
                Ok(End::Complete)
            }
        })
    };
    let serving = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { worker.run_kinds(kinds, shutdown).await }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    for run in [&traced.run_id, &untraced.run_id] {
        while store.inspect(run).await.unwrap().state != RunState::Completed {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{run} not completed"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    shutdown.cancel();
    serving.await.unwrap().unwrap();
    provider.force_flush().unwrap();
    let spans = exporter.get_finished_spans().unwrap();

    let request = named(&spans, "checkout request");
    assert_eq!(request.len(), 1, "{spans:#?}");
    let request = request[0];
    assert_eq!(
        parent.trace_id(),
        request.span_context.trace_id().to_string(),
        "the stored traceparent names the request's trace"
    );
    assert_eq!(parent.span_id(), request.span_context.span_id().to_string());

    let jobs = named(&spans, "job");
    let (in_trace, other): (Vec<&SpanData>, Vec<&SpanData>) = jobs
        .iter()
        .partition(|s| s.span_context.trace_id() == request.span_context.trace_id());
    assert_eq!(
        in_trace.len(),
        2,
        "both attempts of the traced run continue the request's trace: {jobs:#?}"
    );
    for job in &in_trace {
        assert_eq!(
            job.parent_span_id,
            request.span_context.span_id(),
            "each attempt is the enqueuing span's child"
        );
        assert_eq!(job.span_kind, opentelemetry::trace::SpanKind::Consumer);
    }
    assert_eq!(
        other.len(),
        1,
        "the untraced run's attempt starts a trace of its own"
    );
    assert_ne!(other[0].parent_span_id, request.span_context.span_id());

    // The handler's own spans are children of their attempt's span.
    let charges = named(&spans, "charge card");
    assert_eq!(charges.len(), 3);
    for job in &in_trace {
        assert!(
            charges
                .iter()
                .any(|c| c.parent_span_id == job.span_context.span_id()),
            "a handler span under each traced attempt"
        );
    }
}
