//! OpenTelemetry messaging spans, through `tracing`: `publish {destination}` around the broker
//! call for each event a relay publishes, `process {destination}` for each event a subscription
//! processes, with the attributes of the OpenTelemetry messaging semantic conventions
//! (`messaging.system`, `messaging.operation.name`, `messaging.operation.type`,
//! `messaging.destination.name`, `messaging.message.id`), `otel.name` and `otel.kind` for
//! `tracing-opentelemetry`.
//!
//! They are off unless asked for, so that logs stay as they were:
//! [`RelayConfig::messaging_spans`](crate::RelayConfig::messaging_spans) and
//! [`Consumer::messaging_spans`](crate::Consumer::messaging_spans). With the `opentelemetry`
//! feature, each span joins the trace of the event's `traceparent` (the context its unit of
//! work was committed in): the publish span as its child, the process span as its child and
//! linked to it, so that one trace runs from the commit to the consumer. With that feature,
//! `current_traceparent` gives the `traceparent` of the current span, for
//! `EventContext::traceparent`.
//!
//! A subscription processes the events of a batch together: each event's process span covers
//! the batch's processing; the consumer's own spans (`event.consume`, the handlers') are not
//! its children.

/// The operation of a messaging span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Operation {
    /// A relay publishing an event (`messaging.operation.type` = `send`).
    Publish,
    /// A subscription processing an event (`messaging.operation.type` = `process`).
    Process,
}

/// The span of `operation` on the event `message_id` at `destination` of `system`, in the trace
/// of `traceparent` when the `opentelemetry` feature is on.
pub(crate) fn span(
    operation: Operation,
    system: &str,
    destination: &str,
    message_id: &str,
    traceparent: Option<&str>,
) -> tracing::Span {
    let (name, kind, operation_type) = match operation {
        Operation::Publish => ("publish", "producer", "send"),
        Operation::Process => ("process", "consumer", "process"),
    };
    let span = tracing::info_span!(
        "messaging",
        otel.name = %format_args!("{name} {destination}"),
        otel.kind = kind,
        messaging.system = system,
        messaging.operation.name = name,
        messaging.operation.type = operation_type,
        messaging.destination.name = destination,
        messaging.message.id = message_id,
        error.type = tracing::field::Empty,
    );
    #[cfg(feature = "opentelemetry")]
    if let Some(producer) = traceparent.and_then(remote) {
        use opentelemetry::trace::TraceContextExt;
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        let parent = opentelemetry::Context::new().with_remote_span_context(producer.clone());
        let _ = span.set_parent(parent);
        if operation == Operation::Process {
            span.add_link(producer);
        }
    }
    #[cfg(not(feature = "opentelemetry"))]
    let _ = traceparent;
    span
}

/// The span context of a W3C `traceparent`, as a remote one.
#[cfg(feature = "opentelemetry")]
fn remote(traceparent: &str) -> Option<opentelemetry::trace::SpanContext> {
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
    let parsed: event_core::Traceparent = traceparent.parse().ok()?;
    let text = parsed.as_str();
    let trace_id = TraceId::from_hex(text.get(3..35)?).ok()?;
    let span_id = SpanId::from_hex(text.get(36..52)?).ok()?;
    let flags = u8::from_str_radix(text.get(53..55)?, 16).ok()?;
    Some(SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(flags),
        true,
        TraceState::default(),
    ))
}

/// The W3C `traceparent` of the current `tracing` span's OpenTelemetry context, when it has a
/// valid one: what `EventContext::traceparent` takes, so that the events of a unit of work
/// committed inside a traced request carry its trace to the relay and the consumers.
///
/// ```no_run
/// # fn demo() -> Result<(), event_core::TraceparentError> {
/// let mut context = event_core::EventContext::new("order-service");
/// if let Some(traceparent) = event_sqlx::telemetry::current_traceparent() {
///     context = context.traceparent(&traceparent)?;
/// }
/// # Ok(()) }
/// ```
#[cfg(feature = "opentelemetry")]
pub fn current_traceparent() -> Option<String> {
    use opentelemetry::trace::TraceContextExt;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let context = tracing::Span::current().context();
    let span = context.span();
    let span_context = span.span_context();
    span_context.is_valid().then(|| {
        format!(
            "00-{}-{}-{:02x}",
            span_context.trace_id(),
            span_context.span_id(),
            span_context.trace_flags().to_u8()
        )
    })
}
