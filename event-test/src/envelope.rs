//! Envelopes built from derived events, as a producer would have stored and published them.

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use event_core::{DomainEvent, EventContext, EventEnvelope, EventNo, Traceparent};

/// An envelope of `event`, as its producer would publish it: built with [`EnvelopeBuilder`].
///
/// The aggregate is the event's own (its declared type and its `aggregate_id` field), at
/// sequence 1; the event number is its `event_no` template or the unit of work's default;
/// the headers and trace come from `EventContext::new("test")`.
///
/// ```
/// # #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, event_core::DomainEvent)]
/// # #[domain_event(aggregate = "ORDER")]
/// # struct OrderPaid { #[domain_event(aggregate_id)] order_id: String, amount_minor: i64 }
/// let envelope = event_test::envelope(OrderPaid { order_id: "o-1".into(), amount_minor: 1999 })
///     .sequence(2)
///     .build();
/// assert_eq!(envelope.event_id.as_str(), "ORDER_PAID:ORDER:o-1:2");
/// assert_eq!(envelope.aggregate_type, "ORDER");
/// ```
pub fn envelope<E: DomainEvent>(event: E) -> EnvelopeBuilder {
    let payload = serde_json::to_value(&event).unwrap_or_else(|e| {
        serde_json::Value::String(format!("<the payload cannot be serialized: {e}>"))
    });
    EnvelopeBuilder {
        event_type: E::EVENT_TYPE,
        version: E::EVENT_VERSION,
        aggregate_type: E::AGGREGATE_TYPE.unwrap_or("TEST").to_owned(),
        aggregate_id: event.aggregate_id().unwrap_or_else(|| "test-1".to_owned()),
        sequence: 1,
        event_no: event.event_no().map(|no| no.as_str().to_owned()),
        context: EventContext::new("test"),
        occurred_at: None,
        payload,
    }
}

/// Builds an [`EventEnvelope`]; see [`envelope`].
#[derive(Debug, Clone)]
pub struct EnvelopeBuilder {
    event_type: &'static str,
    version: u32,
    aggregate_type: String,
    aggregate_id: String,
    sequence: u64,
    event_no: Option<String>,
    context: EventContext,
    occurred_at: Option<DateTime<Utc>>,
    payload: serde_json::Value,
}

impl EnvelopeBuilder {
    /// The aggregate's type and id.
    pub fn aggregate(mut self, aggregate_type: impl Into<String>, id: impl Into<String>) -> Self {
        self.aggregate_type = aggregate_type.into();
        self.aggregate_id = id.into();
        self
    }

    /// The sequence in the aggregate (from 1).
    pub fn sequence(mut self, sequence: u64) -> Self {
        self.sequence = sequence;
        self
    }

    /// The event number, instead of the template's or the default.
    pub fn event_no(mut self, event_no: impl Into<String>) -> Self {
        self.event_no = Some(event_no.into());
        self
    }

    /// The headers and trace of `context`.
    pub fn context(mut self, context: EventContext) -> Self {
        self.context = context;
        self
    }

    /// When the event occurred (now, by default).
    pub fn occurred_at(mut self, at: DateTime<Utc>) -> Self {
        self.occurred_at = Some(at);
        self
    }

    /// The payload as JSON, instead of the event's: for a payload a consumer must refuse.
    pub fn payload(mut self, payload: serde_json::Value) -> Self {
        self.payload = payload;
        self
    }

    /// The envelope.
    pub fn build(self) -> EventEnvelope {
        let event_no = self.event_no.unwrap_or_else(|| {
            format!(
                "{}:{}:{}:{}",
                self.event_type, self.aggregate_type, self.aggregate_id, self.sequence
            )
        });
        let headers = self.context.headers().clone();
        let trace_id = headers
            .traceparent
            .as_deref()
            .and_then(|t| t.parse::<Traceparent>().ok())
            .map(|t| t.trace_id().to_owned());
        let now = self.occurred_at.unwrap_or_else(Utc::now);
        EventEnvelope {
            event_id: EventNo::from_rendered(&event_no),
            event_type: self.event_type.to_owned(),
            event_version: self.version,
            aggregate_type: self.aggregate_type,
            aggregate_id: self.aggregate_id,
            aggregate_sequence: self.sequence,
            occurred_at: now
                .duration_trunc(TimeDelta::microseconds(1))
                .unwrap_or(now),
            trace_id,
            headers,
            payload: self.payload,
        }
    }
}
