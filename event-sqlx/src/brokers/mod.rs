//! Layer 5: publishers and subscriptions on real brokers, behind cargo features: NATS JetStream (`nats`) and RabbitMQ
//! (`rabbitmq`). Each sends the envelope's JSON, the same shape on every transport, with the
//! event number as the broker's deduplication id and the event's metadata as headers.

#[cfg(feature = "nats")]
mod nats;
#[cfg(feature = "rabbitmq")]
mod rabbitmq;

#[cfg(feature = "nats")]
pub use nats::{JetStreamSubscription, NatsPublisher};

/// What a subscription processed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConsumeReport {
    /// Applied and committed.
    pub applied: usize,
    /// Already consumed.
    pub duplicates: usize,
    /// Not for this consumer.
    pub ignored: usize,
    /// Quarantined (including stale events refused by the per-aggregate guard).
    pub quarantined: usize,
}

impl ConsumeReport {
    #[allow(dead_code)] // used by whichever broker features are on
    pub(crate) fn count(&mut self, outcome: &crate::consumer::Processed) {
        match outcome {
            crate::consumer::Processed::Applied => self.applied += 1,
            crate::consumer::Processed::Duplicate => self.duplicates += 1,
            crate::consumer::Processed::Ignored => self.ignored += 1,
            crate::consumer::Processed::Quarantined(_) | crate::consumer::Processed::Stale => {
                self.quarantined += 1
            }
        }
    }

    #[allow(dead_code)] // used by whichever broker features are on
    pub(crate) fn merge(&mut self, other: ConsumeReport) {
        self.applied += other.applied;
        self.duplicates += other.duplicates;
        self.ignored += other.ignored;
        self.quarantined += other.quarantined;
    }
}
#[cfg(feature = "rabbitmq")]
pub use rabbitmq::{RabbitMqPublisher, RabbitMqSubscription};

use crate::publisher::OutboxMessage;

/// The headers every transport carries, besides the broker's own deduplication id.
#[allow(dead_code)] // used by whichever broker features are on
pub(crate) fn event_headers(message: &OutboxMessage) -> Vec<(&'static str, String)> {
    let e = &message.envelope;
    let mut headers = vec![
        ("eventId", e.event_id.to_string()),
        ("eventType", e.event_type.clone()),
        ("eventVersion", e.event_version.to_string()),
        ("aggregateType", e.aggregate_type.clone()),
        ("aggregateId", e.aggregate_id.clone()),
        ("aggregateSequence", e.aggregate_sequence.to_string()),
    ];
    if let Some(traceparent) = &e.headers.traceparent {
        headers.push(("traceparent", traceparent.clone()));
    }
    headers
}
