//! The envelope: what travels on every transport and is stored in every table.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

use crate::{DomainEvent, EventNo, event::schema_settings};

/// An event with its metadata, in one JSON shape (camelCase) on every transport and in every
/// table:
///
/// ```json
/// {
///   "eventId": "ORDER_PAID:o-1",
///   "eventType": "ORDER_PAID",
///   "eventVersion": 2,
///   "aggregateType": "ORDER",
///   "aggregateId": "o-1",
///   "aggregateSequence": 3,
///   "occurredAt": "2026-01-23T10:20:30.123456Z",
///   "traceId": "4bf92f3577b34da6a3ce929d0e0e4736",
///   "headers": { "tenantId": "acme", "source": "order-service" },
///   "payload": { "order_id": "o-1", "amount_minor": 1999, "currency": "EUR" }
/// }
/// ```
///
/// `eventId` is the [`EventNo`], the key consumers deduplicate on. Its JSON schema is
/// [`EventEnvelope::json_schema`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(
    title = "EventEnvelope",
    description = "A domain event with its metadata: the JSON shape every transport and table carries. eventId is the idempotency key consumers deduplicate on."
)]
pub struct EventEnvelope {
    /// The event number, the idempotency key consumers deduplicate on.
    pub event_id: EventNo,
    /// The stable event type, e.g. `ORDER_PAID`.
    pub event_type: String,
    /// The payload version, from 1.
    pub event_version: u32,
    /// The aggregate type, e.g. `ORDER`.
    pub aggregate_type: String,
    /// The aggregate id.
    pub aggregate_id: String,
    /// The event's position in its aggregate's history, from 1, without gaps.
    pub aggregate_sequence: u64,
    /// When the event was recorded, in UTC with microsecond precision (what every store keeps).
    pub occurred_at: DateTime<Utc>,
    /// The trace id: from the W3C `traceparent` when there was one, or as given.
    pub trace_id: Option<String>,
    /// Tenant, correlation, causation, source service, traceparent and any extra headers.
    #[serde(default)]
    pub headers: EventHeaders,
    /// The payload, as the event type's serde serialization.
    pub payload: serde_json::Value,
}

/// The envelope's headers. Known headers have their own fields; any others are kept in `extra`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventHeaders {
    /// The tenant the event belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<String>,
    /// Groups every event of one business flow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
    /// The event id (or command id) that caused this event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub causation_id: Option<String>,
    /// The service that recorded the event, e.g. `order-service`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The W3C trace context, propagated to the broker's message headers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// Any other headers.
    #[serde(flatten)]
    pub extra: BTreeMap<String, String>,
}

/// Why an envelope could not be decoded into a payload type.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The envelope holds another event type.
    #[error(
        "cannot decode a `{found}` event as `{expected}`: dispatch on `eventType` before decoding"
    )]
    TypeMismatch {
        /// The type asked for.
        expected: &'static str,
        /// The type in the envelope.
        found: String,
    },
    /// The envelope holds another version of the event type.
    #[error(
        "cannot decode `{event_type}` version {found} as version {expected}: register an upcaster from v{found} or decode with the type of that version"
    )]
    VersionMismatch {
        /// The event type.
        event_type: &'static str,
        /// The version asked for.
        expected: u32,
        /// The version in the envelope.
        found: u32,
    },
    /// The payload does not match the type.
    #[error(
        "the payload of `{event_type}` v{version} (event {event_id}) does not match its type: {source}"
    )]
    Payload {
        /// The event type.
        event_type: &'static str,
        /// The version.
        version: u32,
        /// The event number.
        event_id: EventNo,
        /// What serde reported.
        #[source]
        source: serde_json::Error,
    },
}

impl EventEnvelope {
    /// Decodes the payload as `E`, after checking that the envelope holds `E`'s type and version.
    ///
    /// ```
    /// # use event_core::{DomainEvent, EventEnvelope, DecodeError};
    /// # #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent)]
    /// # struct OrderPlaced { order_id: String }
    /// # #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent)]
    /// # struct OrderPaid { order_id: String }
    /// let json = r#"{"eventId":"e-1","eventType":"ORDER_PLACED","eventVersion":1,
    ///   "aggregateType":"ORDER","aggregateId":"o-1","aggregateSequence":1,
    ///   "occurredAt":"2026-01-23T10:20:30Z","traceId":null,"headers":{},
    ///   "payload":{"order_id":"o-1"}}"#;
    /// let envelope: EventEnvelope = serde_json::from_str(json)?;
    /// let placed: OrderPlaced = envelope.decode()?;
    /// assert_eq!(placed.order_id, "o-1");
    /// assert!(matches!(envelope.decode::<OrderPaid>(), Err(DecodeError::TypeMismatch { .. })));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn decode<E: DomainEvent>(&self) -> Result<E, DecodeError> {
        if self.event_type != E::EVENT_TYPE {
            return Err(DecodeError::TypeMismatch {
                expected: E::EVENT_TYPE,
                found: self.event_type.clone(),
            });
        }
        if self.event_version != E::EVENT_VERSION {
            return Err(DecodeError::VersionMismatch {
                event_type: E::EVENT_TYPE,
                expected: E::EVENT_VERSION,
                found: self.event_version,
            });
        }
        E::deserialize(&self.payload).map_err(|source| DecodeError::Payload {
            event_type: E::EVENT_TYPE,
            version: E::EVENT_VERSION,
            event_id: self.event_id.clone(),
            source,
        })
    }

    /// The JSON schema (draft 2020-12) of the envelope.
    pub fn json_schema() -> Schema {
        SchemaGenerator::new(schema_settings()).into_root_schema_for::<EventEnvelope>()
    }
}
