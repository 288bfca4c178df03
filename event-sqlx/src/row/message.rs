//! Rows of the message event table (`biz_message_event`) as Rust values.

use chrono::{DateTime, Utc};
use event_core::EventEnvelope;
use serde_json::Value;

use crate::status::EventStatus;

/// One row of `biz_message_event`, every column.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MessageRecord {
    /// Primary key.
    pub id: i64,
    /// The event number, unique.
    pub event_no: String,
    /// Event type, e.g. ORDER_CREATED.
    pub event_type: String,
    /// Business type, e.g. ORDER.
    pub biz_type: String,
    /// Business id.
    pub biz_id: String,
    /// Source service.
    pub event_source: String,
    /// Payload.
    pub event_payload: Value,
    /// Status.
    pub event_status: EventStatus,
    /// Retries so far.
    pub retry_count: i32,
    /// Maximum retries.
    pub max_retry_count: i32,
    /// When the next retry is due.
    pub next_retry_time: Option<DateTime<Utc>>,
    /// Last handled.
    pub last_handle_time: Option<DateTime<Utc>>,
    /// When it succeeded.
    pub success_time: Option<DateTime<Utc>>,
    /// Last failure.
    pub fail_reason: Option<String>,
    /// Trace id.
    pub trace_id: Option<String>,
    /// Remark.
    pub remark: Option<String>,
    /// Optimistic lock version, bumped by every claim.
    pub version: i32,
    /// Created at.
    pub create_time: DateTime<Utc>,
    /// Updated at.
    pub update_time: DateTime<Utc>,
}

/// A message event to create.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageEvent {
    /// The event number: derive it from the business action, so that creating twice is a no-op.
    pub event_no: String,
    /// Event type.
    pub event_type: String,
    /// Business type.
    pub biz_type: String,
    /// Business id.
    pub biz_id: String,
    /// Source service.
    pub event_source: String,
    /// Payload: the minimal snapshot the handler needs.
    pub payload: Value,
    /// Trace id.
    pub trace_id: Option<String>,
}

impl MessageEvent {
    /// The message for an envelope: biz type and id are its aggregate's.
    pub fn from_envelope(envelope: &EventEnvelope) -> MessageEvent {
        MessageEvent {
            event_no: envelope.event_id.to_string(),
            event_type: envelope.event_type.clone(),
            biz_type: envelope.aggregate_type.clone(),
            biz_id: envelope.aggregate_id.clone(),
            event_source: envelope.headers.source.clone().unwrap_or_default(),
            payload: envelope.payload.clone(),
            trace_id: envelope.trace_id.clone(),
        }
    }
}

/// A message row to insert, validated.
#[derive(Debug, Clone)]
pub(crate) struct NewMessage {
    pub(crate) event_no: String,
    pub(crate) event_type: String,
    pub(crate) biz_type: String,
    pub(crate) biz_id: String,
    pub(crate) event_source: String,
    pub(crate) event_payload: Value,
    pub(crate) max_retry_count: i32,
    pub(crate) trace_id: Option<String>,
    pub(crate) now: DateTime<Utc>,
}
