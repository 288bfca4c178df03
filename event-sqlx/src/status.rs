//! The states rows are in: the status machine both seed tables share (`publish_status` of the
//! outbox, `event_status` of the message event table), and the quarantine's class and status.

use std::fmt;

/// The status of an outbox or message event row, stored as a TINYINT.
///
/// ```text
/// Pending -> InProgress -> Succeeded
/// Pending -> InProgress -> Failed -> Pending
/// Failed  -> InProgress -> Succeeded
/// Pending -> Cancelled
/// Failed  -> Cancelled
/// InProgress -> Failed
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventStatus {
    /// 0: committed, waiting to be published or handled.
    Pending = 0,
    /// 1: claimed by a relay or worker, under its lease.
    InProgress = 1,
    /// 2: published or handled.
    Succeeded = 2,
    /// 3: the last attempt failed; retried when due, while retries remain.
    Failed = 3,
    /// 4: will not be published or handled.
    Cancelled = 4,
}

/// A status value that is not one of 0..=4.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown status {0}: event statuses are 0 pending, 1 in progress, 2 succeeded, 3 failed, 4 cancelled; quarantine statuses 0 quarantined, 1 requeued, 2 replayed, 3 cancelled"
)]
pub struct StatusError(pub i64);

impl EventStatus {
    /// Every status, in order.
    pub const ALL: [EventStatus; 5] = [
        EventStatus::Pending,
        EventStatus::InProgress,
        EventStatus::Succeeded,
        EventStatus::Failed,
        EventStatus::Cancelled,
    ];

    /// The stored value.
    pub const fn code(self) -> i16 {
        self as i16
    }

    /// The status of a stored value.
    pub fn from_code(code: i64) -> Result<EventStatus, StatusError> {
        match code {
            0 => Ok(EventStatus::Pending),
            1 => Ok(EventStatus::InProgress),
            2 => Ok(EventStatus::Succeeded),
            3 => Ok(EventStatus::Failed),
            4 => Ok(EventStatus::Cancelled),
            other => Err(StatusError(other)),
        }
    }

    /// Whether the seeds' status machine allows moving from `self` to `to`.
    pub fn can_move_to(self, to: EventStatus) -> bool {
        use EventStatus::*;
        matches!(
            (self, to),
            (Pending, InProgress)
                | (Pending, Cancelled)
                | (InProgress, Succeeded)
                | (InProgress, Failed)
                | (Failed, InProgress)
                | (Failed, Pending)
                | (Failed, Cancelled)
        )
    }

    /// A lowercase name for people and JSON output.
    pub fn name(self) -> &'static str {
        match self {
            EventStatus::Pending => "pending",
            EventStatus::InProgress => "in_progress",
            EventStatus::Succeeded => "succeeded",
            EventStatus::Failed => "failed",
            EventStatus::Cancelled => "cancelled",
        }
    }
}

impl serde::Serialize for EventStatus {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl fmt::Display for EventStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a consumer put an event in the quarantine (the `failure_class` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FailureClass {
    /// The event can never be processed as it is: bad input, or a version no upcaster reads.
    Permanent,
    /// A dependency kept failing after every attempt.
    Transient,
    /// Older than an event already applied for its aggregate (with `reject_stale`).
    Stale,
}

/// A `failure_class` value that is none of `permanent`, `transient`, `stale`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown failure class `{0}`: the classes are permanent, transient and stale")]
pub struct FailureClassError(pub String);

impl FailureClass {
    /// Every class.
    pub const ALL: [FailureClass; 3] = [
        FailureClass::Permanent,
        FailureClass::Transient,
        FailureClass::Stale,
    ];

    /// The stored name.
    pub fn name(self) -> &'static str {
        match self {
            FailureClass::Permanent => "permanent",
            FailureClass::Transient => "transient",
            FailureClass::Stale => "stale",
        }
    }

    /// The class of a stored name.
    pub fn from_name(name: &str) -> Result<FailureClass, FailureClassError> {
        FailureClass::ALL
            .into_iter()
            .find(|class| class.name() == name)
            .ok_or_else(|| FailureClassError(name.chars().take(40).collect()))
    }
}

impl fmt::Display for FailureClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl serde::Serialize for FailureClass {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

/// Where a quarantined event stands (the `status` column of `quarantined_event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QuarantineStatus {
    /// 0: waiting for a fix and a replay.
    Quarantined = 0,
    /// 1: requeued by an operator (`eventctl quarantine requeue`): the running consumer replays
    /// it with its own handlers on its next loop ([`Consumer::replay_requeued`]).
    ///
    /// [`Consumer::replay_requeued`]: crate::Consumer::replay_requeued
    Requeued = 1,
    /// 2: replayed: applied, or found already applied.
    Replayed = 2,
    /// 3: cancelled by an operator, with the reason: it is never replayed.
    Cancelled = 3,
}

impl QuarantineStatus {
    /// Every status, in code order.
    pub const ALL: [QuarantineStatus; 4] = [
        QuarantineStatus::Quarantined,
        QuarantineStatus::Requeued,
        QuarantineStatus::Replayed,
        QuarantineStatus::Cancelled,
    ];

    /// The status named `name` (`quarantined`, `requeued`, `replayed`, `cancelled`).
    pub fn from_name(name: &str) -> Option<QuarantineStatus> {
        QuarantineStatus::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The stored value.
    pub const fn code(self) -> i16 {
        self as i16
    }

    /// The status of a stored value.
    pub fn from_code(code: i64) -> Result<QuarantineStatus, StatusError> {
        match code {
            0 => Ok(QuarantineStatus::Quarantined),
            1 => Ok(QuarantineStatus::Requeued),
            2 => Ok(QuarantineStatus::Replayed),
            3 => Ok(QuarantineStatus::Cancelled),
            other => Err(StatusError(other)),
        }
    }

    /// A lowercase name for people and JSON output.
    pub fn name(self) -> &'static str {
        match self {
            QuarantineStatus::Quarantined => "quarantined",
            QuarantineStatus::Requeued => "requeued",
            QuarantineStatus::Replayed => "replayed",
            QuarantineStatus::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for QuarantineStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl serde::Serialize for QuarantineStatus {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::EventStatus::{self, *};

    #[test]
    fn codes_round_trip_and_unknown_codes_are_errors() {
        for status in EventStatus::ALL {
            assert_eq!(EventStatus::from_code(i64::from(status.code())), Ok(status));
        }
        assert!(EventStatus::from_code(5).is_err());
        assert!(EventStatus::from_code(-1).is_err());
    }

    #[test]
    fn failure_classes_and_quarantine_statuses_round_trip() {
        for class in super::FailureClass::ALL {
            assert_eq!(super::FailureClass::from_name(class.name()), Ok(class));
        }
        assert!(super::FailureClass::from_name("flaky").is_err());
        for status in super::QuarantineStatus::ALL {
            assert_eq!(
                super::QuarantineStatus::from_code(i64::from(status.code())),
                Ok(status)
            );
            assert_eq!(
                super::QuarantineStatus::from_name(status.name()),
                Some(status)
            );
        }
        assert!(super::QuarantineStatus::from_code(4).is_err());
        assert_eq!(super::QuarantineStatus::from_name("gone"), None);
    }

    #[test]
    fn only_the_seed_transitions_are_allowed() {
        let allowed: Vec<(EventStatus, EventStatus)> = EventStatus::ALL
            .into_iter()
            .flat_map(|a| EventStatus::ALL.into_iter().map(move |b| (a, b)))
            .filter(|(a, b)| a.can_move_to(*b))
            .collect();
        assert_eq!(
            allowed,
            vec![
                (Pending, InProgress),
                (Pending, Cancelled),
                (InProgress, Succeeded),
                (InProgress, Failed),
                (Failed, Pending),
                (Failed, InProgress),
                (Failed, Cancelled),
            ]
        );
        assert!(
            !Succeeded.can_move_to(Pending),
            "a published event is never reset"
        );
    }
}
