//! How a relay runs.

use std::collections::HashSet;
use std::time::Duration;

use super::backoff::Backoff;

/// How a relay runs.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub(crate) instance_id: String,
    pub(crate) batch_size: u32,
    pub(crate) lease: Duration,
    pub(crate) poll_interval: Duration,
    pub(crate) backoff: Backoff,
    pub(crate) recovery_delay: Duration,
    pub(crate) recover_interval: Duration,
    pub(crate) ordered: bool,
    pub(crate) critical: HashSet<String>,
    pub(crate) cancel_exhausted: bool,
    pub(crate) max_rate: Option<u32>,
    pub(crate) metrics_interval: Duration,
}

impl RelayConfig {
    /// A relay named `instance_id` (the `locked_by` of its leases; unique per running relay):
    /// batches of 200, 2-minute leases, per-aggregate order, the default backoff, polling every
    /// second when idle, expired leases recovered every 30 s and retried after 1 minute.
    pub fn new(instance_id: impl Into<String>) -> RelayConfig {
        RelayConfig {
            instance_id: instance_id.into(),
            batch_size: 200,
            lease: Duration::from_secs(120),
            poll_interval: Duration::from_secs(1),
            backoff: Backoff::default(),
            recovery_delay: Duration::from_secs(60),
            recover_interval: Duration::from_secs(30),
            ordered: true,
            critical: HashSet::new(),
            cancel_exhausted: false,
            max_rate: None,
            metrics_interval: Duration::from_secs(15),
        }
    }

    /// Events claimed per batch, from 1 to 5000 (a value outside is taken as the nearest):
    /// the marks of a batch bind a few values per event, and 5000 keeps every statement under
    /// SQLite's limit of bound values.
    pub fn batch_size(mut self, size: u32) -> Self {
        self.batch_size = size.clamp(1, 5000);
        self
    }

    /// How long a claim holds its events. Set it above the longest publish of two batches (on
    /// PostgreSQL and MySQL a batch is claimed while the one before it is still being published):
    /// when it expires, another relay may publish the same events again.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long an idle relay sleeps between polls when nothing wakes it.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// When failed events are retried.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// How often expired leases are recovered, and how long after recovery they are retried.
    pub fn lease_recovery(mut self, every: Duration, retry_after: Duration) -> Self {
        self.recover_interval = every;
        self.recovery_delay = retry_after;
        self
    }

    /// Turns per-aggregate ordering off: events are published as soon as they are due, even
    /// while an earlier event of their aggregate is unpublished. More throughput for a single
    /// busy aggregate; consumers must then cope with reordering.
    pub fn unordered(mut self) -> Self {
        self.ordered = false;
        self
    }

    /// Cancels events that used up their retries, except critical event types, which stay failed
    /// for an operator. Off by default: exhausted events stay failed.
    pub fn cancel_exhausted(mut self) -> Self {
        self.cancel_exhausted = true;
        self
    }

    /// Marks `event_type` critical: it is never cancelled automatically.
    pub fn critical(mut self, event_type: impl Into<String>) -> Self {
        self.critical.insert(event_type.into());
        self
    }

    /// Publishes at most `per_second` events a second.
    pub fn max_rate(mut self, per_second: u32) -> Self {
        self.max_rate = Some(per_second.max(1));
        self
    }

    /// How often [`Relay::run`](crate::Relay::run) samples the backlog gauges (pending, failed,
    /// stuck, oldest pending age; see [`metrics`](crate::metrics)) with a few status-index
    /// queries: every 15 s by default. `Duration::ZERO` turns sampling off.
    pub fn metrics_interval(mut self, every: Duration) -> Self {
        self.metrics_interval = every;
        self
    }

    /// The relay's instance id.
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }
}
