//! The mapping there and back, the rule for foreign events, and what is not a CloudEvent.

use super::*;
use serde_json::json;

fn sample() -> EventEnvelope {
    serde_json::from_value(json!({
        "eventId": "ORDER_PAID:o-1:2", "eventType": "ORDER_PAID", "eventVersion": 2,
        "aggregateType": "ORDER", "aggregateId": "o-1", "aggregateSequence": 2,
        "occurredAt": "2026-12-02T10:11:12.345678Z",
        "traceId": "4bf92f3577b34da6a3ce929d0e0e4736",
        "headers": {
            "tenantId": "acme", "correlationId": "checkout-1", "source": "order-service",
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "region": "eu", "User-Agent": "shop/1.0", "previoussequence": "0",
        },
        "payload": {"order_id": "o-1", "amount_minor": 100},
    }))
    .unwrap()
}

fn now() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2030-01-01T00:00:00Z")
        .unwrap()
        .with_timezone(&Utc)
}

fn binary(
    attributes: Vec<(&str, &str)>,
    content_type: Option<&str>,
    body: &[u8],
) -> Decoded<'static> {
    let inbound = Inbound {
        body: Box::leak(body.to_vec().into_boxed_slice()),
        content_type: content_type.map(str::to_owned),
        attributes: attributes
            .into_iter()
            .map(|(n, v)| (n.to_owned(), v.to_owned()))
            .collect(),
    };
    inbound.decode(now())
}

fn read(decoded: Decoded<'_>) -> EventEnvelope {
    match decoded {
        Decoded::CloudEvent(json) => serde_json::from_slice(&json).unwrap(),
        other => panic!("not read as a CloudEvent: {other:?}"),
    }
}

#[test]
fn binary_mode_carries_every_field_there_and_back() {
    let envelope = sample();
    let attributes: Vec<(String, String)> = attributes(&envelope)
        .into_iter()
        .map(|(n, v)| (n.into_owned(), v))
        .collect();
    let names: Vec<&str> = attributes.iter().map(|(n, _)| n.as_str()).collect();
    assert!(
        names.contains(&"sequence") && names.contains(&"extraheaders"),
        "{names:?}"
    );
    // The relay's stamp after cancelled events travels as an extension of its own.
    assert!(names.contains(&PREVIOUS_SEQUENCE_HEADER), "{names:?}");
    assert!(!names.contains(&"traceid"), "the trace id is traceparent's");
    let sequence = &attributes.iter().find(|(n, _)| n == "sequence").unwrap().1;
    assert_eq!(sequence, "00000000000000000002");
    let body = serde_json::to_vec(&envelope.payload).unwrap();
    let inbound = Inbound {
        body: &body,
        content_type: Some(JSON.to_owned()),
        attributes,
    };
    assert_eq!(read(inbound.decode(now())), envelope);
}

#[test]
fn structured_mode_carries_every_field_there_and_back() {
    let mut envelope = sample();
    envelope.trace_id = Some("not-w3c".to_owned());
    let body = structured(&envelope).unwrap();
    let event: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(event["time"], "2026-12-02T10:11:12.345678Z");
    assert_eq!(event["dataschema"], "urn:event-type:ORDER_PAID:v2");
    assert_eq!(event["data"], envelope.payload);
    assert_eq!(event["traceid"], "not-w3c");
    let inbound = Inbound {
        body: &body,
        content_type: Some(format!("{STRUCTURED}; charset=UTF-8")),
        attributes: Vec::new(),
    };
    assert_eq!(read(inbound.decode(now())), envelope);
}

#[test]
fn a_foreign_event_follows_the_documented_rule() {
    let envelope = read(binary(
        vec![
            ("specversion", "1.0"),
            ("id", "a-uuid"),
            ("source", "https://crm.example/customers"),
            ("type", "com.example.customer.created"),
            ("subject", "c-42"),
            ("region", "eu"),
        ],
        None,
        br#"{"name":"Ada"}"#,
    ));
    assert_eq!(envelope.event_id.as_str(), "a-uuid");
    assert_eq!(envelope.event_version, 1);
    assert_eq!(envelope.aggregate_type, "https://crm.example/customers");
    assert_eq!(envelope.aggregate_id, "c-42");
    assert_eq!(envelope.aggregate_sequence, 0);
    assert_eq!(envelope.occurred_at, now());
    assert_eq!(
        envelope.headers.extra.get("region").map(String::as_str),
        Some("eu")
    );
    assert_eq!(envelope.payload, json!({"name": "Ada"}));
}

#[test]
fn what_is_not_a_cloudevent_says_why() {
    let base = [
        ("specversion", "1.0"),
        ("id", "1"),
        ("source", "s"),
        ("type", "T"),
    ];
    // (attributes set, attribute removed, content type, body, what the reason says)
    type Case = (
        &'static [(&'static str, &'static str)],
        &'static str,
        Option<&'static str>,
        &'static [u8],
        &'static str,
    );
    let cases: [Case; 6] = [
        (&[], "id", None, b"{}", "no id"),
        (
            &[("specversion", "0.3")],
            "",
            None,
            b"{}",
            "only CloudEvents 1.0",
        ),
        (&[("time", "yesterday")], "", None, b"{}", "RFC 3339"),
        (&[], "", None, b"{not json", "not JSON"),
        (&[], "", Some("text/plain"), b"hi", "text/plain"),
        (&[("sequence", "b7")], "", None, b"{}", "not a number"),
    ];
    let mut decoded = Vec::new();
    for (set, removed, content_type, body, expected) in cases {
        let mut attributes: BTreeMap<&str, &str> = base.into_iter().collect();
        attributes.extend(set.iter().copied());
        attributes.remove(removed);
        let attributes = attributes.into_iter().collect();
        decoded.push((binary(attributes, content_type, body), expected));
    }
    let batch = Some("application/cloudevents-batch+json");
    decoded.push((binary(vec![], batch, b"[]"), "one event per message"));
    decoded.push((
        binary(vec![], Some(STRUCTURED), b"[1]"),
        "not a JSON object",
    ));
    for (decoded, expected) in decoded {
        match decoded {
            Decoded::Invalid(reason) => assert!(reason.contains(expected), "{reason}"),
            other => panic!("{expected}: {other:?}"),
        }
    }
}

#[test]
fn a_content_type_with_any_characters_is_read_without_panicking() {
    // A multi-byte character where the structured prefix would end.
    let content_type = "application/cloudevent\u{e9}s+json";
    assert!(matches!(
        binary(vec![], Some(content_type), b"{}"),
        Decoded::Envelope(_)
    ));
}

#[test]
fn a_message_without_cloudevents_headers_is_an_envelope() {
    assert!(matches!(
        binary(vec![], Some(JSON), b"{}"),
        Decoded::Envelope(_)
    ));
}

#[test]
fn header_values_are_percent_encoded_as_the_http_binding_says() {
    assert_eq!(percent_encode("order-service"), "order-service");
    assert_eq!(percent_encode("a b\"%é"), "a%20b%22%25%C3%A9");
    assert_eq!(
        percent_decode("2026-12-02T10%3A11%3A12Z"),
        "2026-12-02T10:11:12Z"
    );
}
