//! OpenTelemetry messaging spans across the relay and a consumer, exported through the
//! OpenTelemetry SDK's in-memory exporter: one trace from the commit to the consumer,
//! span names and attributes as the messaging semantic conventions name them, the publish span
//! a child of the commit, the process span a child of it and linked to it; and nothing of the
//! kind when the option is off.

use std::time::Duration;

use event_core::{EventContext, UnitOfWork};
use event_sqlx::{Consumer, Delivered, HandlerError, RelayConfig};
use event_tests::any_broker::{durable, nats, stream_for};
use event_tests::db::{TestDb, unique};
use event_tests::fixtures::{Order, OrderPlaced, orders_to};
use opentelemetry::trace::{SpanKind, TracerProvider as _};
use opentelemetry::{Key, Value};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use opentelemetry_semantic_conventions::attribute::{
    MESSAGING_DESTINATION_NAME, MESSAGING_MESSAGE_ID, MESSAGING_OPERATION_NAME,
    MESSAGING_OPERATION_TYPE, MESSAGING_SYSTEM,
};
use tracing_subscriber::layer::SubscriberExt;

fn attribute<'s>(span: &'s SpanData, key: &'static str) -> Option<&'s Value> {
    let key = Key::from_static_str(key);
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .map(|kv| &kv.value)
}

fn text(span: &SpanData, key: &'static str) -> String {
    attribute(span, key)
        .map(Value::to_string)
        .unwrap_or_default()
}

/// Commits order `id` inside the span `checkout`, with its traceparent; returns the event number.
async fn commit_traced(
    outbox: &event_sqlx::Outbox<sqlx::Sqlite>,
    id: &str,
    traced: bool,
) -> String {
    let checkout = tracing::info_span!("checkout");
    let mut context = EventContext::new("order-service");
    if traced {
        let traceparent = checkout
            .in_scope(event_sqlx::telemetry::current_traceparent)
            .expect("the checkout span has an OpenTelemetry context");
        context = context.traceparent(&traceparent).unwrap();
    }
    let mut uow = UnitOfWork::new(context);
    uow.collect(&mut Order::place(id, 100).unwrap()).unwrap();
    let _ = outbox
        .commit(outbox.pool().begin().await.unwrap(), uow)
        .await
        .unwrap();
    outbox.by_aggregate("ORDER", id).await.unwrap()[0]
        .event_no
        .clone()
}

// One thread: the subscriber set for the test is the thread's default.
#[tokio::test(flavor = "current_thread")]
async fn one_trace_runs_from_the_commit_through_the_relay_to_the_consumer() {
    let Some(publisher) = nats().await else {
        return;
    };
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("otel-test"));
    let _guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));

    let db = TestDb::sqlite().await.unwrap();
    let topic = unique("otel").replace('_', "-");
    let stream = stream_for(&publisher, &topic).await.unwrap();
    let outbox = orders_to(db.pool(), &topic);
    let subject = format!("{topic}.order.placed");
    let consumer = |spans: bool| {
        Consumer::new(db.pool().clone(), "billing", "1")
            .messaging_spans(spans)
            .on(
                async |_tx: &mut sqlx::SqliteConnection,
                       _e: Delivered<OrderPlaced>|
                       -> Result<(), HandlerError> { Ok(()) },
            )
    };
    let subscription = durable(&publisher, &stream, "billing", &subject).await;

    // With the option on: a traced commit, published and processed.
    // Each order committed, relayed and consumed, with the spans on and then off (the default).
    let mut event_no = String::new();
    for (order, spans) in [("o-1", true), ("o-2", false)] {
        let committed = commit_traced(&outbox, order, spans).await;
        let config = RelayConfig::new(format!("relay-{order}")).messaging_spans(spans);
        let relay = outbox.relay(publisher.clone(), config);
        assert_eq!(relay.drain().await.unwrap().published, 1);
        let idle = Duration::from_millis(300);
        let report = subscription.drain(&consumer(spans), idle).await.unwrap();
        assert_eq!(report.applied, 1, "{report:?}");
        if spans {
            event_no = committed;
        }
    }

    // The process span ends as the batch's processing does; poll for it, with a deadline.
    let process_name = format!("process {subject}");
    let spans = event_tests::wait::until(Duration::from_secs(10), async || {
        provider.force_flush().map_err(|e| e.to_string())?;
        let spans = exporter.get_finished_spans().map_err(|e| e.to_string())?;
        match spans.iter().any(|s| s.name == process_name) {
            true => Ok(spans),
            false => Err(format!(
                "no {process_name} span among {} spans",
                spans.len()
            )),
        }
    })
    .await;
    let named =
        |name: &str| -> Vec<&SpanData> { spans.iter().filter(|s| s.name == name).collect() };
    let checkout = named("checkout");
    let publish = named(&format!("publish {subject}"));
    let process = named(&format!("process {subject}"));
    assert_eq!(
        (checkout.len(), publish.len(), process.len()),
        (2, 1, 1),
        "{spans:#?}"
    );
    let checkout = checkout
        .iter()
        .find(|s| s.span_context.trace_id() == publish[0].span_context.trace_id())
        .expect("the publish span is in the checkout's trace");
    let (publish, process) = (publish[0], process[0]);

    // Names, kinds and attributes as the semantic conventions name them.
    assert_eq!(publish.span_kind, SpanKind::Producer);
    assert_eq!(process.span_kind, SpanKind::Consumer);
    for (span, operation, kind) in [
        (publish, "publish", "send"),
        (process, "process", "process"),
    ] {
        assert_eq!(text(span, MESSAGING_SYSTEM), "nats");
        assert_eq!(text(span, MESSAGING_OPERATION_NAME), operation);
        assert_eq!(text(span, MESSAGING_OPERATION_TYPE), kind);
        assert_eq!(text(span, MESSAGING_DESTINATION_NAME), subject);
        assert_eq!(text(span, MESSAGING_MESSAGE_ID), event_no);
    }

    // Parentage and the link: one trace from the commit to the handler.
    let trace = checkout.span_context.trace_id();
    let commit_span = checkout.span_context.span_id();
    assert_eq!(publish.span_context.trace_id(), trace);
    assert_eq!(publish.parent_span_id, commit_span);
    assert_eq!(process.span_context.trace_id(), trace);
    assert_eq!(process.parent_span_id, commit_span);
    let links: Vec<_> = process
        .links
        .iter()
        .map(|l| l.span_context.clone())
        .collect();
    assert_eq!(links.len(), 1, "{links:?}");
    assert_eq!(links[0].trace_id(), trace);
    assert_eq!(links[0].span_id(), commit_span);
    publisher.jetstream().delete_stream(&stream).await.unwrap();
    db.cleanup().await;
}
