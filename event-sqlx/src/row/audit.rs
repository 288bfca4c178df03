//! Rows of the operators' audit trail (`operation_audit`) and of the inbox as operators read it.

use chrono::{DateTime, Utc};

/// One change an operator made, to record in `operation_audit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAuditEntry {
    /// Who: the operator's name.
    pub actor: String,
    /// What: `outbox.retry`, `outbox.cancel`, `outbox.skip`, `outbox.bulk_retry`,
    /// `quarantine.requeue`, `message.retry`, `message.cancel`.
    pub action: String,
    /// The event, aggregate, entry or filter acted on.
    pub target: String,
    /// How many rows changed.
    pub affected: i64,
    /// Which rows: event numbers or entry ids.
    pub affected_rows: Vec<String>,
    /// Why, as the operator wrote it.
    pub reason: Option<String>,
    /// What happened, in words.
    pub outcome: String,
}

/// One recorded change.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEntry {
    /// Its id, increasing.
    pub id: i64,
    /// When.
    pub action_time: DateTime<Utc>,
    /// Who.
    pub actor: String,
    /// What.
    pub action: String,
    /// On what.
    pub target: String,
    /// How many rows changed.
    pub affected: i64,
    /// Which rows, comma-separated.
    pub affected_rows: Option<String>,
    /// Why.
    pub reason: Option<String>,
    /// What happened.
    pub outcome: String,
}

/// One consumer's record of having consumed an event (a row of `consumed_event`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Consumption {
    /// The consumer.
    pub consumer: String,
    /// When its handler's transaction committed.
    pub consumed_time: DateTime<Utc>,
    /// How many times the event was delivered to it.
    pub deliveries: i64,
}
