//! Rows of the outbox table (`biz_outbox_event`) as Rust values.

use chrono::{DateTime, Utc};
use event_core::{EventEnvelope, EventHeaders, EventNo};
use serde_json::Value;

use crate::error::UnreadableRow;
use crate::status::EventStatus;

/// One row of `biz_outbox_event`, every column.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OutboxRecord {
    /// Primary key.
    pub id: i64,
    /// The event number, the global idempotency key.
    pub event_no: String,
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// Position in the aggregate's history, from 1.
    pub aggregate_sequence: i64,
    /// Event type.
    pub event_type: String,
    /// Event version.
    pub event_version: i32,
    /// Source service.
    pub event_source: String,
    /// Publish channel.
    pub publish_channel: String,
    /// Topic.
    pub topic: Option<String>,
    /// Routing key.
    pub routing_key: Option<String>,
    /// Payload.
    pub event_payload: Value,
    /// Headers.
    pub event_headers: Option<Value>,
    /// Publish status.
    pub publish_status: EventStatus,
    /// Retries so far.
    pub retry_count: i32,
    /// Maximum retries.
    pub max_retry_count: i32,
    /// When the next retry is due.
    pub next_retry_time: Option<DateTime<Utc>>,
    /// The relay instance holding the lease.
    pub locked_by: Option<String>,
    /// When the lease expires.
    pub lock_until: Option<DateTime<Utc>>,
    /// Last publish attempt.
    pub last_publish_time: Option<DateTime<Utc>>,
    /// When it was published.
    pub published_time: Option<DateTime<Utc>>,
    /// The last failure.
    pub fail_reason: Option<String>,
    /// Trace id.
    pub trace_id: Option<String>,
    /// Remark.
    pub remark: Option<String>,
    /// Optimistic lock version, bumped by every claim.
    pub version: i32,
    /// Created at: the event's `occurredAt`.
    pub create_time: DateTime<Utc>,
    /// Updated at.
    pub update_time: DateTime<Utc>,
}

impl OutboxRecord {
    /// The envelope the row stores.
    pub fn envelope(&self) -> Result<EventEnvelope, UnreadableRow> {
        let fail = |problem: String| UnreadableRow {
            id: self.id,
            event_no: self.event_no.clone(),
            problem,
        };
        let headers: EventHeaders = match &self.event_headers {
            None | Some(Value::Null) => EventHeaders::default(),
            Some(value) => serde_json::from_value(value.clone())
                .map_err(|e| fail(format!("unreadable event_headers ({e})")))?,
        };
        Ok(EventEnvelope {
            event_id: EventNo::from_rendered(&self.event_no),
            event_type: self.event_type.clone(),
            event_version: u32::try_from(self.event_version)
                .map_err(|_| fail(format!("a negative event_version {}", self.event_version)))?,
            aggregate_type: self.aggregate_type.clone(),
            aggregate_id: self.aggregate_id.clone(),
            aggregate_sequence: u64::try_from(self.aggregate_sequence).map_err(|_| {
                fail(format!(
                    "a negative aggregate_sequence {}",
                    self.aggregate_sequence
                ))
            })?,
            occurred_at: self.create_time,
            trace_id: self.trace_id.clone(),
            headers,
            payload: self.event_payload.clone(),
        })
    }
}

/// What a flush wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct FlushReport {
    /// Events written by this flush.
    pub recorded: Vec<EventNo>,
    /// Events whose event number was already in the outbox: a retried command. Nothing about
    /// the stored row was changed.
    pub already_recorded: Vec<EventNo>,
}

/// A row to insert, validated.
#[derive(Debug, Clone)]
pub(crate) struct NewOutboxRow {
    pub(crate) event_no: String,
    pub(crate) aggregate_type: String,
    pub(crate) aggregate_id: String,
    pub(crate) aggregate_sequence: i64,
    pub(crate) event_type: String,
    pub(crate) event_version: i32,
    pub(crate) event_source: String,
    pub(crate) publish_channel: String,
    pub(crate) topic: Option<String>,
    pub(crate) routing_key: Option<String>,
    pub(crate) event_payload: Value,
    pub(crate) event_headers: Value,
    pub(crate) max_retry_count: i32,
    pub(crate) trace_id: Option<String>,
    pub(crate) create_time: DateTime<Utc>,
}

/// What an operator's probe reads of the outbox: see [`Outbox::health`].
///
/// [`Outbox::health`]: crate::Outbox::health
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OutboxHealth {
    /// Events waiting to be published.
    pub pending: i64,
    /// Events whose last publish failed (due again later, or out of retries).
    pub failed: i64,
    /// Events in progress whose relay's lease expired: their relay died or stalled.
    pub expired_leases: i64,
    /// How long the oldest pending event has waited, in seconds.
    pub oldest_pending_seconds: Option<i64>,
}

/// The events one relay holds under lease (in progress, `locked_by` = the relay).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    /// The relay's instance id.
    pub relay: String,
    /// Events it holds.
    pub events: i64,
    /// When its first lease expires.
    pub earliest_expiry: DateTime<Utc>,
    /// When its last lease expires.
    pub latest_expiry: DateTime<Utc>,
}

/// Per-status row counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusCounts {
    /// 0: pending.
    pub pending: i64,
    /// 1: in progress.
    pub in_progress: i64,
    /// 2: succeeded.
    pub succeeded: i64,
    /// 3: failed.
    pub failed: i64,
    /// 4: cancelled.
    pub cancelled: i64,
}

impl StatusCounts {
    pub(crate) fn add(&mut self, status: EventStatus, count: i64) {
        match status {
            EventStatus::Pending => self.pending += count,
            EventStatus::InProgress => self.in_progress += count,
            EventStatus::Succeeded => self.succeeded += count,
            EventStatus::Failed => self.failed += count,
            EventStatus::Cancelled => self.cancelled += count,
        }
    }

    /// Every row counted.
    pub fn total(&self) -> i64 {
        self.pending + self.in_progress + self.succeeded + self.failed + self.cancelled
    }
}

/// What a back-office search of the outbox selects: every field set narrows it. Results come
/// newest first, by `(create_time, id)`; [`OutboxSearch::before`] continues after a page's last
/// row (keyset pagination: each page costs the same however deep).
///
/// Which index answers it (seed profile): the event number `uk_event_no`; the aggregate
/// `uk_aggregate_sequence`; the trace id `idx_trace_id`; the event type or the topic, with or
/// without a time range, `idx_event_type_create_time` or `idx_topic_create_time`; a status alone
/// `idx_status_update_time` for the rare statuses and `idx_create_time` for the common ones;
/// nothing or a time range alone, `idx_create_time`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutboxSearch<'a> {
    /// One event number.
    pub event_no: Option<&'a str>,
    /// One aggregate: `(aggregate_type, aggregate_id)`.
    pub aggregate: Option<(&'a str, &'a str)>,
    /// One event type.
    pub event_type: Option<&'a str>,
    /// One topic.
    pub topic: Option<&'a str>,
    /// One trace id.
    pub trace_id: Option<&'a str>,
    /// One status.
    pub status: Option<EventStatus>,
    /// Created at or after.
    pub from: Option<DateTime<Utc>>,
    /// Created before.
    pub to: Option<DateTime<Utc>>,
    /// Only rows older than this `(create_time, id)`: the last row of the previous page.
    pub before: Option<(DateTime<Utc>, i64)>,
}

impl<'a> OutboxSearch<'a> {
    /// Only the event `event_no`.
    pub fn event_no(mut self, event_no: &'a str) -> Self {
        self.event_no = Some(event_no);
        self
    }

    /// Only the events of one aggregate.
    pub fn aggregate(mut self, aggregate_type: &'a str, aggregate_id: &'a str) -> Self {
        self.aggregate = Some((aggregate_type, aggregate_id));
        self
    }

    /// Only events of `event_type`.
    pub fn event_type(mut self, event_type: &'a str) -> Self {
        self.event_type = Some(event_type);
        self
    }

    /// Only events routed to `topic`.
    pub fn topic(mut self, topic: &'a str) -> Self {
        self.topic = Some(topic);
        self
    }

    /// Only events of the trace `trace_id`.
    pub fn trace_id(mut self, trace_id: &'a str) -> Self {
        self.trace_id = Some(trace_id);
        self
    }

    /// Only events in `status`.
    pub fn status(mut self, status: EventStatus) -> Self {
        self.status = Some(status);
        self
    }

    /// Only events created in `[from, to)`; either end may be open.
    pub fn created(mut self, from: Option<DateTime<Utc>>, to: Option<DateTime<Utc>>) -> Self {
        self.from = from;
        self.to = to;
        self
    }

    /// The page after `last`, the last row of the previous page.
    pub fn after_row(mut self, last: &OutboxRecord) -> Self {
        self.before = Some((last.create_time, last.id));
        self
    }
}

/// How many rows share one value of a column.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GroupCount {
    /// The value (empty for NULL).
    pub key: String,
    /// How many rows.
    pub count: i64,
}

/// Events published and events failed in one minute, by the time their row last changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MinuteCount {
    /// The start of the minute.
    pub minute: DateTime<Utc>,
    /// Rows now published whose last change (the publish) fell in this minute.
    pub published: i64,
    /// Rows now failed whose last change (the failed attempt) fell in this minute.
    pub failed: i64,
}
