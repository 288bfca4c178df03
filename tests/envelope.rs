//! The envelope's JSON shape, its schema, and the typed decode.

use event_core::{DecodeError, DomainEvent, EventContext, EventEnvelope, UnitOfWork};
use event_tests::fixtures::{Order, OrderPaid, OrderPlaced};
use serde_json::json;

fn paid_envelope() -> EventEnvelope {
    let mut order = Order::place("o-1", 1999).unwrap();
    order.pay(1999).unwrap();
    let mut uow = UnitOfWork::new(EventContext::new("order-service").tenant_id("acme"));
    uow.collect(&mut order).unwrap();
    uow.commit().remove(1)
}

#[test]
fn serializes_in_camel_case_with_every_field() {
    let value = serde_json::to_value(paid_envelope()).unwrap();
    let keys: Vec<&str> = value
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        vec![
            "aggregateId",
            "aggregateSequence",
            "aggregateType",
            "eventId",
            "eventType",
            "eventVersion",
            "headers",
            "occurredAt",
            "payload",
            "traceId"
        ]
    );
    assert_eq!(value["eventId"], json!("ORDER_PAID:o-1"));
    assert_eq!(value["eventVersion"], json!(2));
    assert_eq!(value["aggregateSequence"], json!(2));
    assert_eq!(value["traceId"], json!(null));
    assert_eq!(
        value["headers"],
        json!({"tenantId": "acme", "source": "order-service"})
    );
    assert_eq!(
        value["payload"],
        json!({"order_id": "o-1", "amount_minor": 1999, "currency": "EUR"})
    );
}

#[test]
fn round_trips_through_json() {
    let envelope = paid_envelope();
    let text = serde_json::to_string(&envelope).unwrap();
    let back: EventEnvelope = serde_json::from_str(&text).unwrap();
    assert_eq!(back, envelope);
}

#[test]
fn decodes_to_the_payload_type() {
    let paid: OrderPaid = paid_envelope().decode().unwrap();
    assert_eq!(paid.amount_minor, 1999);
}

#[test]
fn decode_fails_clearly_on_type_version_and_payload_mismatch() {
    let envelope = paid_envelope();

    let err = envelope.decode::<OrderPlaced>().unwrap_err();
    assert!(matches!(
        err,
        DecodeError::TypeMismatch {
            expected: "ORDER_PLACED",
            ..
        }
    ));
    assert!(
        err.to_string()
            .contains("cannot decode a `ORDER_PAID` event as `ORDER_PLACED`"),
        "{err}"
    );

    let mut v1 = envelope.clone();
    v1.event_version = 1;
    let err = v1.decode::<OrderPaid>().unwrap_err();
    assert!(matches!(
        err,
        DecodeError::VersionMismatch {
            expected: 2,
            found: 1,
            ..
        }
    ));
    assert!(err.to_string().contains("upcaster"), "{err}");

    let mut broken = envelope;
    broken.payload = json!({"order_id": "o-1", "amount_minor": "lots"});
    let err = broken.decode::<OrderPaid>().unwrap_err();
    assert!(matches!(err, DecodeError::Payload { .. }));
    assert!(err.to_string().contains("ORDER_PAID:o-1"), "{err}");
}

#[test]
fn the_envelope_has_a_json_schema_that_its_json_satisfies() {
    let schema = serde_json::to_value(EventEnvelope::json_schema()).unwrap();
    let required: Vec<&str> = schema["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for field in [
        "eventId",
        "eventType",
        "eventVersion",
        "aggregateType",
        "aggregateId",
        "aggregateSequence",
        "occurredAt",
        "payload",
    ] {
        assert!(required.contains(&field), "{field} is required in {schema}");
    }
    let properties = schema["properties"].as_object().unwrap();
    let instance = serde_json::to_value(paid_envelope()).unwrap();
    for key in instance.as_object().unwrap().keys() {
        assert!(
            properties.contains_key(key),
            "{key} is not described by the schema"
        );
    }
    assert_eq!(
        schema["properties"]["occurredAt"]["format"],
        json!("date-time")
    );
}

#[test]
fn the_event_schema_carries_type_and_version() {
    let schema = serde_json::to_value(OrderPaid::event_schema()).unwrap();
    assert_eq!(schema["x-event-type"], json!("ORDER_PAID"));
    assert_eq!(schema["x-event-version"], json!(2));
    assert_eq!(schema["x-aggregate-type"], json!("ORDER"));
    assert_eq!(
        schema["$schema"],
        json!("https://json-schema.org/draft/2020-12/schema")
    );
    assert_eq!(
        schema["properties"]["amount_minor"]["type"],
        json!("integer")
    );
    assert_eq!(OrderPaid::EVENT_VERSION, 2);
}
