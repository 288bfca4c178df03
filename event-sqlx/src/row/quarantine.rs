//! Rows of a consumer's quarantine (`quarantined_event`) as Rust values, and the filter that
//! selects them.

use chrono::{DateTime, Utc};

use crate::status::{FailureClass, QuarantineStatus};

/// A quarantined event, as stored.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct QuarantineRecord {
    /// Primary key.
    pub id: i64,
    /// The consumer.
    pub consumer: String,
    /// The consumer version that failed.
    pub consumer_version: String,
    /// The eventId, or a digest of a body that could not be read.
    pub event_id: String,
    /// The event type, when readable.
    pub event_type: Option<String>,
    /// The message as received.
    pub body: String,
    /// Why it is here.
    pub failure_class: FailureClass,
    /// The last failure.
    pub reason: String,
    /// Failed attempts.
    pub retry_count: i32,
    /// Who recovers it.
    pub owner: Option<String>,
    /// Quarantined, or replayed.
    pub status: QuarantineStatus,
    /// First failure.
    pub first_failure_time: DateTime<Utc>,
    /// Last failure.
    pub last_failure_time: DateTime<Utc>,
    /// When it was replayed.
    pub replay_time: Option<DateTime<Utc>>,
}

impl QuarantineRecord {
    /// Whether it was replayed.
    pub fn replayed(&self) -> bool {
        self.status == QuarantineStatus::Replayed
    }
}

/// Which quarantined events of a consumer to list or replay; unset fields match everything.
/// The database applies the filter, so every match is found however many rows precede it.
///
/// ```
/// use event_sqlx::{FailureClass, QuarantineFilter};
///
/// let filter = QuarantineFilter::default()
///     .event_type("ORDER_PAID")
///     .failure_class(FailureClass::Permanent);
/// # let _ = filter;
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuarantineFilter<'a> {
    /// One event by its eventId.
    pub event_id: Option<&'a str>,
    /// One event type.
    pub event_type: Option<&'a str>,
    /// One failure class.
    pub failure_class: Option<FailureClass>,
    /// First failed at or after.
    pub from: Option<DateTime<Utc>>,
    /// First failed before.
    pub to: Option<DateTime<Utc>>,
}

impl<'a> QuarantineFilter<'a> {
    /// Only the event `event_id`.
    pub fn event_id(mut self, event_id: &'a str) -> Self {
        self.event_id = Some(event_id);
        self
    }

    /// Only events of `event_type`.
    pub fn event_type(mut self, event_type: &'a str) -> Self {
        self.event_type = Some(event_type);
        self
    }

    /// Only events quarantined as `class`.
    pub fn failure_class(mut self, class: FailureClass) -> Self {
        self.failure_class = Some(class);
        self
    }

    /// Only events that first failed in `[from, to)`.
    pub fn first_failed_between(mut self, from: DateTime<Utc>, to: DateTime<Utc>) -> Self {
        self.from = Some(from);
        self.to = Some(to);
        self
    }
}

/// A quarantine entry to write, or to count once more when the event is already there.
#[derive(Debug, Clone)]
pub(crate) struct NewQuarantine {
    pub(crate) consumer: String,
    pub(crate) consumer_version: String,
    pub(crate) event_id: String,
    pub(crate) event_type: Option<String>,
    pub(crate) body: String,
    pub(crate) failure_class: FailureClass,
    pub(crate) reason: String,
    pub(crate) retry_count: i32,
    pub(crate) owner: Option<String>,
    pub(crate) now: DateTime<Utc>,
}
