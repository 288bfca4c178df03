//! The wire formats on the real brokers: the default format pinned byte for byte (one message
//! per broker, as it was before CloudEvents existed), and a message that claims to be a
//! CloudEvent and is not one quarantined with the reason.

use std::time::Duration;

use chrono::{DateTime, Utc};
use event_core::{EventEnvelope, EventHeaders, EventNo};
use event_sqlx::{Consumer, Delivered, HandlerError, OutboxMessage, Publisher, QuarantineFilter};
use event_tests::any_broker::{
    delete_queue, durable, first_message, get_one, kafka, nats, rabbitmq, stream_for,
};
use event_tests::db::{TestDb, kafka_url, unique};
use event_tests::fixtures::OrderPlaced;

/// One event, every field fixed.
fn pinned(topic: &str) -> OutboxMessage {
    EventEnvelope {
        event_id: EventNo::from_rendered("ORDER_PAID:o-pin"),
        event_type: "ORDER_PAID".to_owned(),
        event_version: 1,
        aggregate_type: "ORDER".to_owned(),
        aggregate_id: "o-pin".to_owned(),
        aggregate_sequence: 2,
        occurred_at: DateTime::parse_from_rfc3339("2026-12-02T10:11:12.345678Z")
            .unwrap()
            .with_timezone(&Utc),
        trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736".to_owned()),
        headers: EventHeaders {
            tenant_id: Some("acme".to_owned()),
            source: Some("order-service".to_owned()),
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned()),
            ..EventHeaders::default()
        },
        payload: serde_json::json!({"order_id": "o-pin", "amount_minor": 100}),
    }
    .into_message(topic)
}

trait IntoMessage {
    fn into_message(self, topic: &str) -> OutboxMessage;
}

impl IntoMessage for EventEnvelope {
    fn into_message(self, topic: &str) -> OutboxMessage {
        OutboxMessage {
            message_id: self.event_id.to_string(),
            envelope: self,
            channel: "MQ".to_owned(),
            topic: Some(topic.to_owned()),
            routing_key: Some("order.paid".to_owned()),
            retry_count: 0,
        }
    }
}

/// The body of [`pinned`] in the default format, as it has always been.
const BODY: &str = concat!(
    r#"{"eventId":"ORDER_PAID:o-pin","eventType":"ORDER_PAID","eventVersion":1,"#,
    r#""aggregateType":"ORDER","aggregateId":"o-pin","aggregateSequence":2,"#,
    r#""occurredAt":"2026-12-02T10:11:12.345678Z","traceId":"4bf92f3577b34da6a3ce929d0e0e4736","#,
    r#""headers":{"tenantId":"acme","source":"order-service","#,
    r#""traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},"#,
    r#""payload":{"amount_minor":100,"order_id":"o-pin"}}"#
);

/// Its headers in the default format, besides the broker's own id.
const HEADERS: [(&str, &str); 7] = [
    ("eventId", "ORDER_PAID:o-pin"),
    ("eventType", "ORDER_PAID"),
    ("eventVersion", "1"),
    ("aggregateType", "ORDER"),
    ("aggregateId", "o-pin"),
    ("aggregateSequence", "2"),
    (
        "traceparent",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ),
];

fn sorted(mut headers: Vec<(String, String)>) -> Vec<(String, String)> {
    headers.sort();
    headers
}

fn expected_headers(own: (&str, &str)) -> Vec<(String, String)> {
    sorted(
        HEADERS
            .iter()
            .chain([&own])
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect(),
    )
}

#[tokio::test]
async fn the_default_format_on_jetstream_is_byte_for_byte_what_it_was() {
    let Some(publisher) = nats().await else {
        return;
    };
    let topic = unique("pin").replace('_', "-");
    let stream = stream_for(&publisher, &topic).await.unwrap();
    let results = publisher.publish(&[pinned(&topic)]).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let js = publisher.jetstream();
    let message = first_message(js, &stream).await;
    assert_eq!(std::str::from_utf8(&message.payload).unwrap(), BODY);
    let headers = message
        .headers
        .iter()
        .map(|(name, values)| {
            let name: &str = name.as_ref();
            (name.to_owned(), values[0].as_str().to_owned())
        })
        .collect();
    assert_eq!(
        sorted(headers),
        expected_headers(("Nats-Msg-Id", "ORDER_PAID:o-pin"))
    );
    js.delete_stream(&stream).await.unwrap();
}

#[tokio::test]
async fn the_default_format_on_rabbitmq_is_byte_for_byte_what_it_was() {
    use lapin::types::AMQPValue;
    let Some(publisher) = rabbitmq().await else {
        return;
    };
    let exchange = unique("pin").replace('_', "-");
    publisher.declare_exchange(&exchange).await.unwrap();
    let queue = format!("{exchange}-pin");
    let _bound = event_sqlx::RabbitMqSubscription::bind(&publisher, &exchange, &queue, "order.*")
        .await
        .unwrap();
    let results = publisher.publish(&[pinned(&exchange)]).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let delivery = get_one(&publisher, &queue).await.expect("the message");
    assert_eq!(std::str::from_utf8(&delivery.data).unwrap(), BODY);
    let p = &delivery.properties;
    assert_eq!(
        p.message_id().as_ref().map(|m| m.as_str()),
        Some("ORDER_PAID:o-pin")
    );
    assert_eq!(
        p.content_type().as_ref().map(|m| m.as_str()),
        Some("application/json")
    );
    assert_eq!(*p.delivery_mode(), Some(2));
    let headers = p
        .headers()
        .as_ref()
        .unwrap()
        .inner()
        .iter()
        .map(|(name, value)| match value {
            AMQPValue::LongString(v) => (name.to_string(), v.to_string()),
            other => panic!("{name} is not a long string: {other:?}"),
        })
        .collect();
    let mut expected = expected_headers(("", ""));
    expected.retain(|(n, _)| !n.is_empty());
    assert_eq!(sorted(headers), expected);
    delete_queue(&publisher, &queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_format_on_kafka_is_byte_for_byte_what_it_was() {
    use rdkafka::Message;
    use rdkafka::consumer::{Consumer as _, StreamConsumer};
    use rdkafka::message::Headers;
    let Some(publisher) = kafka().await else {
        return;
    };
    let url = kafka_url();
    let topic = unique("pin").replace('_', "-");
    publisher.ensure_topic(&topic, 1).await.unwrap();
    let results = publisher.publish(&[pinned(&topic)]).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    // Read the one partition by assignment: no consumer group to join on
    // the broker, and none to leave when the reader is dropped.
    let reader: StreamConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &url)
        .set("group.id", unique("pin"))
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut partitions = rdkafka::TopicPartitionList::new();
    partitions
        .add_partition_offset(&topic, 0, rdkafka::Offset::Beginning)
        .unwrap();
    reader.assign(&partitions).unwrap();
    let message = tokio::time::timeout(Duration::from_secs(30), reader.recv())
        .await
        .expect("the record within 30 s")
        .unwrap();
    assert_eq!(message.key(), Some(b"o-pin".as_slice()));
    assert_eq!(
        std::str::from_utf8(message.payload().unwrap()).unwrap(),
        BODY
    );
    let headers = message
        .headers()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h.key.to_owned(),
                String::from_utf8(h.value.unwrap().to_vec()).unwrap(),
            )
        })
        .collect();
    assert_eq!(
        sorted(headers),
        expected_headers(("messageId", "ORDER_PAID:o-pin"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_claims_to_be_a_cloudevent_and_is_not_is_quarantined_with_why() {
    let Some(publisher) = nats().await else {
        return;
    };
    let db = TestDb::sqlite().await.unwrap();
    let topic = unique("bad-ce").replace('_', "-");
    let stream = stream_for(&publisher, &topic).await.unwrap();
    let subject = format!("{topic}.order.placed");
    let send = async |headers: &[(&str, &str)], body: &'static str| {
        let mut map = async_nats::HeaderMap::new();
        for (name, value) in headers {
            map.insert(*name, *value);
        }
        publisher
            .jetstream()
            .publish_with_headers(subject.clone(), map, body.into())
            .await
            .unwrap()
            .await
            .unwrap();
    };
    let valid = [
        ("ce-specversion", "1.0"),
        ("ce-source", "https%3A%2F%2Fcrm.example"),
        ("ce-type", "ORDER_PLACED"),
        ("content-type", "application/json"),
    ];
    // No id; then a time that is no time; then a good one, which goes on.
    send(&valid, r#"{"order_id":"x","amount_minor":1}"#).await;
    let with = |extra: (&'static str, &'static str)| {
        let mut h = valid.to_vec();
        h.push(extra);
        h
    };
    send(
        &[with(("ce-id", "bad-time")), vec![("ce-time", "yesterday")]].concat(),
        r#"{"order_id":"y","amount_minor":1}"#,
    )
    .await;
    send(
        &with(("ce-id", "good")),
        r#"{"order_id":"z","amount_minor":1}"#,
    )
    .await;

    let consumer = Consumer::new(db.pool().clone(), "strict", "1").on(
        async |_tx: &mut sqlx::SqliteConnection,
               _e: Delivered<OrderPlaced>|
               -> Result<(), HandlerError> { Ok(()) },
    );
    let subscription = durable(&publisher, &stream, "strict", &subject).await;
    let report = subscription
        .drain(&consumer, Duration::from_millis(500))
        .await
        .unwrap();
    assert_eq!((report.applied, report.quarantined), (1, 2), "{report:?}");
    let quarantine = event_sqlx::Quarantine::new(db.pool().clone());
    let entries = quarantine
        .entries(Some("strict"), None, &QuarantineFilter::default(), 0, 10)
        .await
        .unwrap();
    let mut reasons: Vec<&str> = entries.iter().map(|e| e.reason.as_str()).collect();
    reasons.sort();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(
        reasons.iter().any(|r| r.contains("it has no id")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("time yesterday is not an RFC 3339 timestamp")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .all(|r| r.starts_with("not a readable CloudEvent")),
        "{reasons:?}"
    );
    publisher.jetstream().delete_stream(&stream).await.unwrap();
    db.cleanup().await;
}
