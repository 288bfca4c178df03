//! What a test expects of an event: its type, its payload in full or in part, and any field of
//! its envelope.

use event_core::{DomainEvent, EventEnvelope};
use serde_json::{Map, Value, json};

use crate::check::{contains, diff, pretty, project};

/// One expected event, matched against an envelope.
///
/// ```
/// # #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, event_core::DomainEvent)]
/// # struct OrderPaid { order_id: String, amount_minor: i64 }
/// use event_test::Expected;
/// use serde_json::json;
///
/// // This payload, exactly:
/// Expected::event(OrderPaid { order_id: "o-1".into(), amount_minor: 1999 });
/// // An ORDER_PAID whose payload has at least these fields, as the 2nd event of its aggregate,
/// // caused by command c-7:
/// Expected::like::<OrderPaid>(json!({ "amount_minor": 1999 }))
///     .sequence(2)
///     .envelope(json!({ "headers": { "causationId": "c-7" } }));
/// ```
#[derive(Debug, Clone)]
pub struct Expected {
    event_type: String,
    version: Option<u32>,
    payload: Payload,
    envelope: Map<String, Value>,
}

#[derive(Debug, Clone)]
enum Payload {
    Exactly(Value),
    Containing(Value),
    Any,
}

impl Expected {
    /// An event of `E`'s type and version with exactly this payload.
    pub fn event<E: DomainEvent>(event: E) -> Expected {
        let payload = serde_json::to_value(&event)
            .unwrap_or_else(|e| Value::String(format!("<the payload cannot be serialized: {e}>")));
        Expected {
            event_type: E::EVENT_TYPE.to_owned(),
            version: Some(E::EVENT_VERSION),
            payload: Payload::Exactly(payload),
            envelope: Map::new(),
        }
    }

    /// An event of `E`'s type and version whose payload contains `partial`: each field named
    /// there has that value (objects in part, arrays in full), other fields may be anything.
    pub fn like<E: DomainEvent>(partial: Value) -> Expected {
        Expected {
            payload: Payload::Containing(partial),
            ..Expected::of_type::<E>()
        }
    }

    /// Any event of `E`'s type and version.
    pub fn of_type<E: DomainEvent>() -> Expected {
        Expected {
            event_type: E::EVENT_TYPE.to_owned(),
            version: Some(E::EVENT_VERSION),
            payload: Payload::Any,
            envelope: Map::new(),
        }
    }

    /// Any event of type `event_type`, any version: for events without a Rust type here.
    pub fn named(event_type: impl Into<String>) -> Expected {
        Expected {
            event_type: event_type.into(),
            version: None,
            payload: Payload::Any,
            envelope: Map::new(),
        }
    }

    /// ... with this payload, in part (see [`Expected::like`]).
    pub fn payload_like(mut self, partial: Value) -> Expected {
        self.payload = Payload::Containing(partial);
        self
    }

    /// ... whose event number (the envelope's `eventId`) is `event_no`.
    pub fn event_no(self, event_no: &str) -> Expected {
        self.envelope(json!({ "eventId": event_no }))
    }

    /// ... at this sequence of its aggregate.
    pub fn sequence(self, sequence: u64) -> Expected {
        self.envelope(json!({ "aggregateSequence": sequence }))
    }

    /// ... of this aggregate.
    pub fn aggregate(self, aggregate_type: &str, aggregate_id: &str) -> Expected {
        self.envelope(json!({ "aggregateType": aggregate_type, "aggregateId": aggregate_id }))
    }

    /// ... with this header: `tenantId`, `correlationId`, `causationId`, `source`,
    /// `traceparent`, or one of the application's own.
    pub fn header(self, name: &str, value: &str) -> Expected {
        self.envelope(json!({ "headers": { name: value } }))
    }

    /// ... whose envelope, as JSON (the wire names: `eventId`, `aggregateSequence`,
    /// `headers`, `traceId`, ...), contains `partial`.
    pub fn envelope(mut self, partial: Value) -> Expected {
        if let Value::Object(fields) = partial {
            merge(&mut self.envelope, fields);
        }
        self
    }

    /// Where `envelope` differs from this expectation.
    pub(crate) fn mismatch(&self, envelope: &EventEnvelope) -> Option<String> {
        let actual = envelope_json(envelope);
        contains(&actual, &self.shape()).err()
    }

    /// The expectation as the JSON it asks the envelope to contain.
    fn shape(&self) -> Value {
        let mut shape = Map::new();
        shape.insert("eventType".into(), Value::String(self.event_type.clone()));
        if let Some(version) = self.version {
            shape.insert("eventVersion".into(), json!(version));
        }
        let mut envelope = self.envelope.clone();
        envelope.remove("payload");
        merge(&mut shape, envelope);
        match &self.payload {
            Payload::Exactly(p) | Payload::Containing(p) => {
                shape.insert("payload".into(), p.clone());
            }
            Payload::Any => {}
        }
        Value::Object(shape)
    }

    /// What the expectation shows in a diff, and the actual envelope cut to the same fields
    /// (the whole payload where the payload is expected exactly).
    fn shown(&self, envelope: Option<&EventEnvelope>) -> (Value, Option<Value>) {
        let shape = self.shape();
        let actual = envelope.map(|e| {
            let full = envelope_json(e);
            let mut cut = project(&full, &shape);
            if let (Payload::Exactly(_), Value::Object(cut)) = (&self.payload, &mut cut) {
                cut.insert("payload".into(), e.payload.clone());
            }
            cut
        });
        (shape, actual)
    }
}

fn merge(into: &mut Map<String, Value>, from: Map<String, Value>) {
    for (key, value) in from {
        match (into.get_mut(&key), value) {
            (Some(Value::Object(have)), Value::Object(more)) => merge(have, more),
            (_, value) => {
                into.insert(key, value);
            }
        }
    }
}

pub(crate) fn envelope_json(envelope: &EventEnvelope) -> Value {
    serde_json::to_value(envelope).unwrap_or(Value::Null)
}

/// Checks `actual` against `expected`, in order and in number. `None` when they match;
/// otherwise a report: what differs, then a diff of the expected and actual envelopes.
pub(crate) fn compare(expected: &[Expected], actual: &[EventEnvelope]) -> Option<String> {
    let mut problems = Vec::new();
    if expected.len() != actual.len() {
        let got: Vec<String> = actual
            .iter()
            .map(|e| format!("{} ({})", e.event_id, e.event_type))
            .collect();
        problems.push(format!(
            "expected {} event(s), got {}{}{}",
            expected.len(),
            actual.len(),
            if got.is_empty() { "" } else { ": " },
            got.join(", ")
        ));
    }
    for (i, (want, have)) in expected.iter().zip(actual).enumerate() {
        if let Some(why) = want.mismatch(have) {
            problems.push(format!("event {i} ({}): {why}", have.event_id));
        }
    }
    if problems.is_empty() {
        return None;
    }
    let (mut want, mut have) = (Vec::new(), Vec::new());
    for i in 0..expected.len().max(actual.len()) {
        match expected.get(i) {
            Some(e) => {
                let (shape, cut) = e.shown(actual.get(i));
                want.push(shape);
                if let Some(cut) = cut {
                    have.push(cut);
                }
            }
            None => {
                if let Some(a) = actual.get(i) {
                    have.push(envelope_json(a));
                }
            }
        }
    }
    Some(format!(
        "{}\n\n{}",
        problems.join("\n"),
        diff(
            &pretty(&Value::Array(want)),
            &pretty(&Value::Array(have)),
            "expected",
            "actual"
        )
    ))
}
