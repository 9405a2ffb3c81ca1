-- A run's trace context (NewRun::with_trace_parent): the W3C traceparent of the span that
-- enqueued it, immutable for the run's life like its payload, and kept beside it in
-- run_payloads, read by a primary-key probe of its own in the claims and inspect: the runs
-- rows, which claims, renewals and ends rewrite, do not widen. A run with a trace context and no payload has a row whose
-- payload is NULL (and NULL and an empty payload stay apart); a run with neither has no row.
ALTER TABLE run_payloads ALTER COLUMN payload DROP NOT NULL;
ALTER TABLE run_payloads ADD COLUMN trace_parent TEXT;
