//! The status machine both seed tables share: `publish_status` of the outbox and `event_status`
//! of the message event table.

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
    "unknown event status {0}: the statuses are 0 pending, 1 in progress, 2 succeeded, 3 failed, 4 cancelled"
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
    pub fn code(self) -> i16 {
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
