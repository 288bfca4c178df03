//! Snapshots of what goes on the wire: the row as stored and the message as published, with
//! ids and times redacted, compared with the committed snapshots in `tests/snapshots/`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use event_core::{Aggregate, DomainEvent, RecordedEvents, UnitOfWork};
use event_test::{Harness, assert_wire_snapshot, wire};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(aggregate = "ORDER", event_no = "ORDER_PAID:{order_id}")]
struct OrderPaid {
    #[domain_event(aggregate_id)]
    order_id: String,
    amount_minor: i64,
    currency: String,
}

#[derive(Aggregate)]
#[aggregate(type = "ORDER")]
struct Order {
    #[aggregate(id)]
    id: String,
    events: RecordedEvents,
}

#[tokio::test]
async fn the_stored_row_and_the_published_message_match_their_snapshots() {
    let mut h = Harness::new().await.unwrap();
    let mut order = Order {
        id: "o-1".into(),
        events: RecordedEvents::loaded_at(1),
    };
    order
        .record(OrderPaid {
            order_id: "o-1".into(),
            amount_minor: 1999,
            currency: "EUR".into(),
        })
        .unwrap();
    let context = h
        .context("order-service")
        .tenant_id("acme")
        .correlation_id("checkout-7")
        .traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        .unwrap();
    let mut uow = UnitOfWork::new(context);
    uow.collect(&mut order).unwrap();
    let tx = h.pool().begin().await.unwrap();
    let _ = h.outbox().commit(tx, uow).await.unwrap();

    let stored = h
        .outbox()
        .by_event_no("ORDER_PAID:o-1")
        .await
        .unwrap()
        .unwrap();
    assert_wire_snapshot!("order_paid_stored", wire::stored(&stored));

    h.settle().await.unwrap();
    let published = h.published();
    assert_eq!(published.len(), 1);
    assert_wire_snapshot!("order_paid_published", wire::published(&published[0]));
    let marked = h
        .outbox()
        .by_event_no("ORDER_PAID:o-1")
        .await
        .unwrap()
        .unwrap();
    assert_wire_snapshot!("order_paid_marked", wire::stored(&marked));
}
