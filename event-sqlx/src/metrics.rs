//! The metrics the relay, the message worker and consumers record, through the [`metrics`]
//! facade: the application installs the exporter it wants (Prometheus, StatsD, OpenTelemetry),
//! and without one, recording costs next to nothing.
//!
//! Counters end in `_total`, durations are in seconds. `deploy/prometheus/alerts.yml` and
//! `deploy/grafana/outbox.json` in the repository use these names.
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `event_outbox_claimed_total` | counter | `topic`, `event_type` | events a relay leased |
//! | `event_outbox_published_total` | counter | `topic`, `event_type` | events published and marked |
//! | `event_outbox_failed_total` | counter | `topic`, `event_type` | publishes that failed (retried with backoff) |
//! | `event_outbox_retried_total` | counter | `topic`, `event_type` | claims of events that had failed before |
//! | `event_outbox_cancelled_total` | counter | | events cancelled after their last retry |
//! | `event_outbox_lease_lost_total` | counter | | events published after their lease had expired |
//! | `event_outbox_leases_recovered_total` | counter | | events whose relay died, put back |
//! | `event_outbox_batch_size` | histogram | | events per claimed batch |
//! | `event_outbox_publish_latency_seconds` | histogram | `topic` | commit to publish acknowledged |
//! | `event_outbox_backlog` | gauge | `status` = `pending`, `failed`, `stuck` | rows per state, sampled |
//! | `event_outbox_oldest_pending_age_seconds` | gauge | | age of the oldest pending event, sampled |
//! | `event_consumer_events_total` | counter | `consumer`, `event_type`, `outcome` | `applied`, `duplicate`, `ignored`, `quarantined`, `stale`, `early` (given back: its aggregate's previous sequence was not applied yet) |
//! | `event_consumer_order_gaps_total` | counter | `consumer` | events applied without their predecessor, which did not arrive within [`Consumer::order_wait`](crate::Consumer::order_wait) |
//! | `event_consumer_handle_seconds` | histogram | `consumer` | one event's handling, inbox transaction included |
//! | `event_consumer_batch_size` | histogram | `consumer` | events per batch transaction ([`Consumer::receive_batch`](crate::Consumer::receive_batch)) |
//! | `event_consumer_batch_seconds` | histogram | `consumer` | one batch transaction, commit included |
//! | `event_consumer_requeued_replayed_total` | counter | `consumer` | requeued quarantine entries replayed |
//! | `event_message_processed_total` | counter | `biz_type`, `outcome` | `succeeded`, `failed`, `cancelled` |
//!
//! The backlog gauges are sampled by [`Relay::run`](crate::Relay::run) every
//! [`RelayConfig::metrics_interval`](crate::RelayConfig::metrics_interval), with the cheap
//! status-index queries of [`Outbox::health`](crate::Outbox::health).

use std::collections::HashMap;

use ::metrics::{Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge};

use crate::row::outbox::{OutboxHealth, OutboxRecord};

/// Events a relay leased.
pub const OUTBOX_CLAIMED: &str = "event_outbox_claimed_total";
/// Events published and marked.
pub const OUTBOX_PUBLISHED: &str = "event_outbox_published_total";
/// Publishes that failed.
pub const OUTBOX_FAILED: &str = "event_outbox_failed_total";
/// Claims of events that had failed before.
pub const OUTBOX_RETRIED: &str = "event_outbox_retried_total";
/// Events cancelled after their last retry.
pub const OUTBOX_CANCELLED: &str = "event_outbox_cancelled_total";
/// Events published after their lease expired.
pub const OUTBOX_LEASE_LOST: &str = "event_outbox_lease_lost_total";
/// Events given back unpublished because the broker was unavailable, not counted as attempts.
pub const OUTBOX_DEFERRED: &str = "event_outbox_deferred_total";
/// Events whose relay died, put back.
pub const OUTBOX_LEASES_RECOVERED: &str = "event_outbox_leases_recovered_total";
/// Events per claimed batch.
pub const OUTBOX_BATCH_SIZE: &str = "event_outbox_batch_size";
/// Commit to publish acknowledged, in seconds.
pub const OUTBOX_PUBLISH_LATENCY: &str = "event_outbox_publish_latency_seconds";
/// Rows per state (`pending`, `failed`, `stuck`), sampled.
pub const OUTBOX_BACKLOG: &str = "event_outbox_backlog";
/// Age of the oldest pending event in seconds, sampled.
pub const OUTBOX_OLDEST_PENDING_AGE: &str = "event_outbox_oldest_pending_age_seconds";
/// What consumers did with each event, by `outcome`.
pub const CONSUMER_EVENTS: &str = "event_consumer_events_total";
/// One event's handling in seconds.
pub const CONSUMER_HANDLE_SECONDS: &str = "event_consumer_handle_seconds";
/// Events per batch transaction of a batched consumer.
pub const CONSUMER_BATCH_SIZE: &str = "event_consumer_batch_size";
/// One batch transaction of a batched consumer, in seconds.
pub const CONSUMER_BATCH_SECONDS: &str = "event_consumer_batch_seconds";
/// Events applied without their aggregate's previous sequence, which did not come in time.
pub const CONSUMER_ORDER_GAPS: &str = "event_consumer_order_gaps_total";
/// Requeued quarantine entries replayed by the running consumer.
pub const CONSUMER_REQUEUED_REPLAYED: &str = "event_consumer_requeued_replayed_total";
/// What the message worker did, by `outcome`.
pub const MESSAGE_PROCESSED: &str = "event_message_processed_total";

/// Registers the description and unit of every metric with the installed recorder, so that an
/// exporter can show them (Prometheus `# HELP` lines). Call it once after installing the recorder.
pub fn describe() {
    describe_counter!(OUTBOX_CLAIMED, "Outbox events leased by a relay.");
    describe_counter!(OUTBOX_PUBLISHED, "Outbox events published and marked.");
    describe_counter!(
        OUTBOX_FAILED,
        "Outbox publishes that failed; retried with backoff."
    );
    describe_counter!(
        OUTBOX_RETRIED,
        "Claims of outbox events that failed before."
    );
    describe_counter!(
        OUTBOX_CANCELLED,
        "Outbox events cancelled after their last retry."
    );
    describe_counter!(
        OUTBOX_LEASE_LOST,
        "Outbox events published after their lease expired; another relay may publish them again."
    );
    describe_counter!(
        OUTBOX_DEFERRED,
        "Outbox events given back unpublished while the broker was unavailable; not counted as attempts."
    );
    describe_counter!(
        OUTBOX_LEASES_RECOVERED,
        "Outbox events whose relay died, put back to be published."
    );
    describe_histogram!(OUTBOX_BATCH_SIZE, Unit::Count, "Events per claimed batch.");
    describe_histogram!(
        OUTBOX_PUBLISH_LATENCY,
        Unit::Seconds,
        "From the event's commit to its publish acknowledged."
    );
    describe_gauge!(
        OUTBOX_BACKLOG,
        Unit::Count,
        "Outbox rows pending, failed, or held by an expired lease (stuck), sampled."
    );
    describe_gauge!(
        OUTBOX_OLDEST_PENDING_AGE,
        Unit::Seconds,
        "Age of the oldest pending outbox event, sampled; 0 when none is pending."
    );
    describe_counter!(
        CONSUMER_EVENTS,
        "Events a consumer processed, by outcome: applied, duplicate, ignored, quarantined, stale."
    );
    describe_histogram!(
        CONSUMER_HANDLE_SECONDS,
        Unit::Seconds,
        "One event's handling, inbox transaction included."
    );
    describe_histogram!(
        CONSUMER_BATCH_SIZE,
        "Events per batch transaction of a batched consumer."
    );
    describe_histogram!(
        CONSUMER_BATCH_SECONDS,
        Unit::Seconds,
        "One batch transaction of a batched consumer, commit included."
    );
    describe_counter!(
        CONSUMER_ORDER_GAPS,
        "Events applied without their aggregate's previous sequence, which did not arrive in time."
    );
    describe_counter!(
        CONSUMER_REQUEUED_REPLAYED,
        "Requeued quarantine entries the running consumer replayed."
    );
    describe_counter!(
        MESSAGE_PROCESSED,
        "Message-table rows the worker processed, by outcome."
    );
}

/// Counts `records` under `name`, one increment per (topic, event type) present.
pub(crate) fn count_by_type<'a>(
    name: &'static str,
    records: impl Iterator<Item = &'a OutboxRecord>,
) {
    let mut groups: HashMap<(&str, &str), u64> = HashMap::new();
    for record in records {
        *groups
            .entry((
                record.topic.as_deref().unwrap_or(""),
                record.event_type.as_str(),
            ))
            .or_default() += 1;
    }
    for ((topic, event_type), n) in groups {
        counter!(name, "topic" => topic.to_owned(), "event_type" => event_type.to_owned())
            .increment(n);
    }
}

/// Sets the backlog gauges from a health sample.
pub(crate) fn record_health(health: &OutboxHealth) {
    gauge!(OUTBOX_BACKLOG, "status" => "pending").set(health.pending as f64);
    gauge!(OUTBOX_BACKLOG, "status" => "failed").set(health.failed as f64);
    gauge!(OUTBOX_BACKLOG, "status" => "stuck").set(health.expired_leases as f64);
    gauge!(OUTBOX_OLDEST_PENDING_AGE).set(health.oldest_pending_seconds.unwrap_or(0) as f64);
}
