//! Publishing through the relay to real NATS JetStream and RabbitMQ.

use std::time::Duration;

use event_core::{EventContext, EventEnvelope, UnitOfWork};
use event_sqlx::{
    EventStatus, NatsPublisher, Outbox, OutboxMessage, Publisher, RabbitMqPublisher, RelayConfig,
};
use event_tests::any_broker::stream_for;
use event_tests::any_broker::stream_messages;
use event_tests::any_broker::{nats, rabbitmq};
use event_tests::db::{TestDb, amqp_url, unique};
use event_tests::fixtures::{Order, orders_to};
use lapin::options::{BasicGetOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};

/// An outbox on a fresh SQLite file with `count` orders placed, each routed to `topic`.
async fn outbox_with(db: &TestDb<sqlx::Sqlite>, topic: &str, count: usize) -> Outbox<sqlx::Sqlite> {
    let outbox = orders_to(db.pool(), topic);
    let mut uow = UnitOfWork::new(
        EventContext::new("order-service")
            .traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
            .unwrap(),
    );
    for i in 0..count {
        uow.collect(&mut Order::place(&format!("o-{i}"), i as i64).unwrap())
            .unwrap();
    }
    let _ = outbox
        .commit(db.pool().begin().await.unwrap(), uow)
        .await
        .unwrap();
    outbox
}

#[tokio::test]
async fn nats_jetstream_receives_every_event_once_with_its_headers() {
    let Some(publisher) = nats().await else {
        return;
    };
    let db = TestDb::sqlite().await.unwrap();
    let topic = unique("evt").replace('_', "-");
    let stream = stream_for(&publisher, &topic).await.unwrap();
    let outbox = outbox_with(&db, &topic, 20).await;

    let relay = outbox.relay(publisher.clone(), RelayConfig::new("nats-relay"));
    let report = relay.run_once().await.unwrap();
    assert_eq!((report.claimed, report.published), (20, 20));

    let js = publisher.jetstream();
    assert_eq!(stream_messages(&publisher, &stream).await, 20);
    let first = js
        .get_stream(&stream)
        .await
        .unwrap()
        .get_raw_message(1)
        .await
        .unwrap();
    assert_eq!(first.subject.as_str(), format!("{topic}.order.placed"));
    let envelope: EventEnvelope = serde_json::from_slice(&first.payload).unwrap();
    let header = |name: &str| first.headers.get(name).map(|v| v.as_str().to_owned());
    assert_eq!(
        header("Nats-Msg-Id").as_deref(),
        Some(envelope.event_id.as_str())
    );
    assert_eq!(header("eventType").as_deref(), Some("ORDER_PLACED"));
    assert_eq!(header("aggregateSequence").as_deref(), Some("1"));
    assert_eq!(
        header("traceparent").as_deref(),
        Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    );

    // Published again (a relay that lost its lease): the stream drops the duplicates.
    let again: Vec<OutboxMessage> = outbox
        .by_aggregate("ORDER", "o-0")
        .await
        .unwrap()
        .iter()
        .map(|r| OutboxMessage::from_record(r).unwrap())
        .collect();
    assert!(publisher.publish(&again).await.iter().all(Result::is_ok));
    assert_eq!(
        stream_messages(&publisher, &stream).await,
        20,
        "Nats-Msg-Id deduplicated the second publish"
    );
    js.delete_stream(&stream).await.unwrap();
    db.cleanup().await;
}

/// The partition key (the aggregate id) as the subject's last token, made safe for a subject.
#[tokio::test]
async fn nats_subject_per_aggregate_ends_with_the_aggregate_id() {
    let Some(publisher) = nats().await else {
        return;
    };
    let publisher = publisher.subject_per_aggregate(true);
    let db = TestDb::sqlite().await.unwrap();
    let topic = unique("part").replace('_', "-");
    let stream = stream_for(&publisher, &topic).await.unwrap();
    let outbox = outbox_with(&db, &topic, 3).await;
    let report = outbox
        .relay(publisher.clone(), RelayConfig::new("r"))
        .drain()
        .await
        .unwrap();
    assert_eq!(report.published, 3);
    let js = publisher.jetstream();
    let mut subjects = Vec::new();
    for seq in 1..=3 {
        let message = js
            .get_stream(&stream)
            .await
            .unwrap()
            .get_raw_message(seq)
            .await
            .unwrap();
        subjects.push(message.subject.to_string());
    }
    subjects.sort();
    assert_eq!(
        subjects,
        (0..3)
            .map(|i| format!("{topic}.order.placed.o-{i}"))
            .collect::<Vec<_>>()
    );
    // An id with characters a subject token cannot hold still makes one token.
    let mut message =
        OutboxMessage::from_record(&outbox.by_aggregate("ORDER", "o-0").await.unwrap()[0]).unwrap();
    message.envelope.aggregate_id = "a.b c*>".into();
    assert_eq!(
        publisher.subject(&message),
        format!("{topic}.order.placed.a_b_c__")
    );
    js.delete_stream(&stream).await.unwrap();
    db.cleanup().await;
}

#[tokio::test]
async fn nats_without_a_stream_for_the_subject_fails_the_publish_and_keeps_the_event() {
    let Some(publisher) = nats().await else {
        return;
    };
    let db = TestDb::sqlite().await.unwrap();
    let outbox = outbox_with(&db, &unique("nostream").replace('_', "-"), 2).await;
    let report = outbox
        .relay(publisher, RelayConfig::new("r"))
        .run_once()
        .await
        .unwrap();
    assert_eq!((report.published, report.failed), (0, 2));
    let row = outbox.by_aggregate("ORDER", "o-0").await.unwrap().remove(0);
    assert_eq!(row.publish_status, EventStatus::Failed);
    assert!(row.fail_reason.unwrap().contains("NATS"));
    db.cleanup().await;
}

#[tokio::test]
async fn rabbitmq_receives_persistent_messages_with_message_id_and_headers() {
    let Some(publisher) = rabbitmq().await else {
        return;
    };
    let db = TestDb::sqlite().await.unwrap();
    let exchange = unique("evt").replace('_', "-");
    publisher.declare_exchange(&exchange).await.unwrap();
    let channel = publisher.channel();
    channel
        .queue_declare(
            ShortString::from(exchange.as_str()),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    channel
        .queue_bind(
            ShortString::from(exchange.as_str()),
            ShortString::from(exchange.as_str()),
            ShortString::from("order.*"),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let outbox = outbox_with(&db, &exchange, 20).await;
    // Two relays in one process share the publisher: one a clone, one behind an Arc.
    let shared = std::sync::Arc::new(publisher.clone());
    let (one, two) = (
        outbox.relay(publisher, RelayConfig::new("amqp-relay-1").batch_size(10)),
        outbox.relay(shared, RelayConfig::new("amqp-relay-2").batch_size(10)),
    );
    let (one, two) = tokio::join!(one.drain(), two.drain());
    let (one, two) = (one.unwrap(), two.unwrap());
    assert_eq!(one.published + two.published, 20, "{one:?} {two:?}");

    let url2 = amqp_url();
    let reader = RabbitMqPublisher::connect(&url2).await.unwrap();
    let mut ids = std::collections::HashSet::new();
    for _ in 0..20 {
        let got = reader
            .channel()
            .basic_get(
                ShortString::from(exchange.as_str()),
                BasicGetOptions { no_ack: true },
            )
            .await
            .unwrap()
            .expect("a message for each event");
        let props = &got.delivery.properties;
        let envelope: EventEnvelope = serde_json::from_slice(&got.delivery.data).unwrap();
        assert_eq!(
            props.message_id().as_ref().map(|m| m.as_str()),
            Some(envelope.event_id.as_str())
        );
        assert_eq!(*props.delivery_mode(), Some(2), "persistent");
        let headers = props.headers().as_ref().unwrap();
        assert!(
            matches!(headers.inner().get("eventType"), Some(AMQPValue::LongString(v)) if v.to_string() == "ORDER_PLACED")
        );
        ids.insert(envelope.event_id.to_string());
    }
    assert_eq!(ids.len(), 20);
    reader
        .channel()
        .queue_delete(
            ShortString::from(exchange.as_str()),
            QueueDeleteOptions::default(),
        )
        .await
        .unwrap();
    db.cleanup().await;
}

#[tokio::test]
async fn rabbitmq_unroutable_messages_are_failures_not_deliveries() {
    let Some(publisher) = rabbitmq().await else {
        return;
    };
    let db = TestDb::sqlite().await.unwrap();
    let exchange = unique("nobody").replace('_', "-");
    publisher.declare_exchange(&exchange).await.unwrap();
    let outbox = outbox_with(&db, &exchange, 3).await;
    let report = outbox
        .relay(publisher, RelayConfig::new("r"))
        .run_once()
        .await
        .unwrap();
    assert_eq!((report.published, report.failed), (0, 3));
    let row = outbox.by_aggregate("ORDER", "o-1").await.unwrap().remove(0);
    assert!(
        row.fail_reason.unwrap().contains("no queue is bound"),
        "the reason says why"
    );
    db.cleanup().await;
}

#[tokio::test]
async fn an_unreachable_broker_is_a_clear_error() {
    let err = NatsPublisher::connect("nats://127.0.0.1:1")
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("NATS at nats://127.0.0.1:1: cannot connect"),
        "{err}"
    );
    let err = tokio::time::timeout(
        Duration::from_secs(30),
        RabbitMqPublisher::connect("amqp://guest:guest@127.0.0.1:1/%2f"),
    )
    .await
    .expect("fails fast")
    .unwrap_err();
    // The address, its password hidden.
    assert!(
        err.to_string()
            .contains("RabbitMQ at amqp://guest:***@127.0.0.1:1/%2f: cannot connect"),
        "{err}"
    );
    assert!(!err.is_refused_login(), "nobody refused a login: {err}");
}
