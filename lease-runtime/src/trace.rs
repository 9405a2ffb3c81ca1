//! Traces across the queue: the span that enqueues a run and the span that runs it, in one
//! trace.
//!
//! A run carries the W3C `traceparent` it was created under
//! ([`NewRun::with_trace_parent`](lease_core::NewRun::with_trace_parent)). With the `otel`
//! feature, a typed insert ([`InsertExt::insert`](crate::InsertExt::insert)) takes it from the
//! current `tracing` span's OpenTelemetry context ([`current_trace_parent`]), and the
//! [`Worker`](crate::Worker)'s `job` span for each attempt is made its child: one trace from
//! the request that enqueued the job to the handler that ran it, across processes and retries
//! (each attempt a child of the enqueuing span, as OpenTelemetry's messaging conventions
//! describe a consumer's `process` span continuing its message's creation context). Without
//! the feature the `job` span still records the `traceparent` as a field, for logs.

use lease_core::TraceParent;

/// The `traceparent` of the current `tracing` span's OpenTelemetry context, when it has a
/// valid one (a `tracing-opentelemetry` layer is installed and the span is recorded); `None`
/// otherwise, and always without the `otel` feature.
pub fn current_trace_parent() -> Option<TraceParent> {
    #[cfg(feature = "otel")]
    {
        use opentelemetry::trace::TraceContextExt;
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        let context = tracing::Span::current().context();
        let span = context.span();
        let sc = span.span_context();
        if !sc.is_valid() {
            return None;
        }
        TraceParent::new(format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        ))
        .ok()
    }
    #[cfg(not(feature = "otel"))]
    {
        None
    }
}

/// Makes `span` continue `parent`: records it in the span's `trace_parent` field and, with the
/// `otel` feature, makes it the span's OpenTelemetry parent (a remote parent).
pub(crate) fn continue_trace(span: &tracing::Span, parent: Option<&TraceParent>) {
    let Some(parent) = parent else {
        return;
    };
    span.record("trace_parent", parent.as_str());
    #[cfg(feature = "otel")]
    {
        use opentelemetry::trace::{
            SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
        };
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        let (Ok(trace), Ok(id)) = (
            TraceId::from_hex(parent.trace_id()),
            SpanId::from_hex(parent.span_id()),
        ) else {
            return;
        };
        let flags = if parent.sampled() {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        let remote = SpanContext::new(trace, id, flags, true, TraceState::default());
        let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
    }
}
