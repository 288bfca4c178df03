//! Aggregates and the unit of work: numbering, stamping, hand-over on commit, and the errors.

use chrono::{TimeZone, Utc};
use event_core::{Aggregate, DomainEvent, EventContext, RecordError, RecordedEvents, UnitOfWork};
use event_tests::fixtures::{NoteAdded, Order, OrderPaid, OrderPlaced, Payment, PaymentCaptured};

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn context() -> EventContext {
    EventContext::new("order-service")
        .tenant_id("acme")
        .correlation_id("checkout-7")
        .causation_id("cmd-1")
        .header("channel", "web")
        .traceparent(TRACEPARENT)
        .expect("valid traceparent")
}

#[test]
fn numbers_events_per_aggregate_from_the_loaded_version() {
    let mut order = Order::loaded("o-1", 7, false);
    order.pay(100).unwrap();
    order.note("gift");
    let mut payment = Payment {
        id: "p-9".into(),
        events: RecordedEvents::new(),
    };
    payment
        .record(PaymentCaptured {
            payment_id: "p-9".into(),
        })
        .unwrap();

    let mut uow = UnitOfWork::new(context());
    assert_eq!(uow.collect(&mut order).unwrap(), 2);
    assert_eq!(uow.collect(&mut payment).unwrap(), 1);
    let envelopes = uow.commit();

    let seen: Vec<(&str, &str, u64, &str)> = envelopes
        .iter()
        .map(|e| {
            (
                e.aggregate_type.as_str(),
                e.aggregate_id.as_str(),
                e.aggregate_sequence,
                e.event_id.as_str(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            ("ORDER", "o-1", 8, "ORDER_PAID:o-1"),
            ("ORDER", "o-1", 9, "NOTE_ADDED:ORDER:o-1:9"),
            ("PAYMENT", "p-9", 1, "PAYMENT_CAPTURED:PAYMENT:p-9:1"),
        ]
    );
    assert_eq!(order.events.version(), 9);
    assert_eq!(order.events.pending_len(), 0);
}

#[test]
fn stamps_time_trace_and_headers() {
    let at = Utc.with_ymd_and_hms(2026, 5, 13, 10, 0, 0).unwrap()
        + chrono::TimeDelta::nanoseconds(123_456_789);
    let mut order = Order::place("o-2", 500).unwrap();
    let mut uow = UnitOfWork::new(context().occurred_at(at));
    uow.collect(&mut order).unwrap();
    let envelope = &uow.commit()[0];

    // Truncated to microseconds, what every store keeps.
    assert_eq!(
        envelope.occurred_at,
        Utc.with_ymd_and_hms(2026, 5, 13, 10, 0, 0).unwrap()
            + chrono::TimeDelta::microseconds(123_456)
    );
    assert_eq!(
        envelope.trace_id.as_deref(),
        Some("4bf92f3577b34da6a3ce929d0e0e4736")
    );
    assert_eq!(envelope.headers.traceparent.as_deref(), Some(TRACEPARENT));
    assert_eq!(envelope.headers.tenant_id.as_deref(), Some("acme"));
    assert_eq!(
        envelope.headers.correlation_id.as_deref(),
        Some("checkout-7")
    );
    assert_eq!(envelope.headers.causation_id.as_deref(), Some("cmd-1"));
    assert_eq!(envelope.headers.source.as_deref(), Some("order-service"));
    assert_eq!(
        envelope.headers.extra.get("channel").map(String::as_str),
        Some("web")
    );
    assert_eq!(envelope.event_type, OrderPlaced::EVENT_TYPE);
    assert_eq!(envelope.event_version, 1);
}

#[test]
fn hands_over_nothing_until_committed() {
    let mut order = Order::place("o-3", 1).unwrap();
    let mut uow = UnitOfWork::new(EventContext::new("order-service"));
    uow.collect(&mut order).unwrap();
    assert_eq!(uow.len(), 1);
    drop(uow);
    // The events left the aggregate with the dropped unit of work, exactly like its unsaved
    // state: the application reloads the aggregate. Nothing was handed over to anyone.
    assert_eq!(order.events.pending_len(), 0);

    let empty = UnitOfWork::new(EventContext::new("order-service"));
    assert!(empty.is_empty());
    assert!(empty.commit().is_empty());
}

#[test]
fn collecting_twice_continues_the_numbering() {
    let mut order = Order::place("o-4", 1).unwrap();
    let mut uow = UnitOfWork::new(EventContext::new("order-service"));
    uow.collect(&mut order).unwrap();
    order.pay(1).unwrap();
    uow.collect(&mut order).unwrap();
    let sequences: Vec<u64> = uow.commit().iter().map(|e| e.aggregate_sequence).collect();
    assert_eq!(sequences, vec![1, 2]);
}

#[test]
fn recording_on_the_wrong_aggregate_type_is_an_error() {
    let mut order = Order::place("o-5", 1).unwrap();
    let err = order
        .record(PaymentCaptured {
            payment_id: "o-5".into(),
        })
        .unwrap_err();
    assert!(matches!(
        err,
        RecordError::AggregateTypeMismatch {
            declared: "PAYMENT",
            aggregate: "ORDER",
            ..
        }
    ));
    let message = err.to_string();
    assert!(
        message.contains("PAYMENT") && message.contains("record it on a `PAYMENT` aggregate"),
        "{message}"
    );
    assert_eq!(order.events.pending_len(), 1, "nothing recorded on error");
}

#[test]
fn recording_an_event_of_another_aggregate_id_is_an_error() {
    let mut order = Order::place("o-6", 1).unwrap();
    let err = order
        .record(OrderPaid {
            order_id: "o-999".into(),
            amount_minor: 1,
            currency: "EUR".into(),
        })
        .unwrap_err();
    assert!(
        matches!(err, RecordError::AggregateIdMismatch { .. }),
        "{err}"
    );
}

#[test]
fn invalid_aggregate_ids_are_rejected_and_nothing_is_taken() {
    for id in ["", &"x".repeat(65)] {
        let mut order = Order::loaded(id, 0, false);
        order.record(NoteAdded { text: "n".into() }).unwrap();
        let mut uow = UnitOfWork::new(EventContext::new("s"));
        let err = uow.collect(&mut order).unwrap_err();
        assert!(
            matches!(err, RecordError::InvalidAggregateId { .. }),
            "{err}"
        );
        assert_eq!(order.events.pending_len(), 1);
        assert_eq!(order.events.version(), 0);
        assert!(uow.is_empty());
    }
}

#[test]
fn an_empty_rendered_event_no_is_rejected() {
    let mut order = Order::loaded("", 0, false);
    order.id = "o-7".into();
    // A template whose only field is empty renders an empty idempotency key.
    #[derive(
        serde::Serialize, serde::Deserialize, schemars::JsonSchema, event_core::DomainEvent,
    )]
    #[domain_event(event_no = "{reference}")]
    struct Referenced {
        reference: String,
    }
    order
        .record(Referenced {
            reference: String::new(),
        })
        .unwrap();
    let mut uow = UnitOfWork::new(EventContext::new("s"));
    let err = uow.collect(&mut order).unwrap_err();
    assert!(matches!(err, RecordError::EmptyEventNo { .. }), "{err}");
    assert_eq!(order.events.pending_len(), 1);
}

#[test]
fn caused_by_carries_correlation_causation_and_trace() {
    let mut order = Order::place("o-8", 1).unwrap();
    let mut uow = UnitOfWork::new(context());
    uow.collect(&mut order).unwrap();
    let cause = uow.commit().remove(0);

    let follow_up = EventContext::caused_by("invoice-service", &cause);
    assert_eq!(
        follow_up.headers().causation_id.as_deref(),
        Some(cause.event_id.as_str())
    );
    assert_eq!(
        follow_up.headers().correlation_id.as_deref(),
        Some("checkout-7")
    );
    assert_eq!(follow_up.headers().tenant_id.as_deref(), Some("acme"));
    assert_eq!(
        follow_up.headers().traceparent.as_deref(),
        Some(TRACEPARENT)
    );
    assert_eq!(follow_up.source(), "invoice-service");
}

#[test]
fn malformed_traceparents_are_rejected() {
    for bad in [
        "",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
    ] {
        let err = EventContext::new("s").traceparent(bad).unwrap_err();
        assert!(err.to_string().contains("W3C Trace Context"), "{err}");
    }
}
