//! How a relay runs.

use std::collections::HashSet;
use std::time::Duration;

use super::backoff::Backoff;

/// The lease unless [`RelayConfig::lease`] sets another.
pub(crate) const DEFAULT_LEASE: Duration = Duration::from_secs(15);
/// How often a running relay recovers expired leases by default.
pub(crate) const DEFAULT_RECOVER_INTERVAL: Duration = Duration::from_secs(5);
/// How long after recovery an event is due by default.
pub(crate) const DEFAULT_RECOVERY_DELAY: Duration = Duration::from_secs(5);
/// The longest [`RelayConfig::linger`].
const MAX_LINGER: Duration = Duration::from_secs(60);
/// [`RelayConfig::linger`] unless set.
pub(crate) const DEFAULT_LINGER: Duration = Duration::from_millis(10);
/// The shortest outage pause.
const OUTAGE_MIN_PAUSE: Duration = Duration::from_millis(250);

/// How a relay runs.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub(crate) instance_id: String,
    /// OpenTelemetry messaging spans around each publish.
    pub(crate) messaging_spans: bool,
    pub(crate) batch_size: u32,
    pub(crate) lease: Duration,
    pub(crate) poll_interval: Duration,
    pub(crate) linger: Duration,
    pub(crate) backoff: Backoff,
    pub(crate) recovery_delay: Duration,
    pub(crate) recover_interval: Duration,
    pub(crate) ordered: bool,
    pub(crate) critical: HashSet<String>,
    pub(crate) cancel_exhausted: bool,
    pub(crate) max_rate: Option<u32>,
    pub(crate) metrics_interval: Duration,
    pub(crate) outage_pause: Duration,
    pub(crate) shutdown_grace: Duration,
    pub(crate) synchronous_commit: bool,
}

impl RelayConfig {
    /// A relay named `instance_id` (the `locked_by` of its leases; unique per running relay):
    /// batches of 200, 15-second leases renewed every 5 s while a batch is in flight,
    /// per-aggregate order, the default backoff, polling every second when idle, a 10 ms
    /// linger under a steady stream, expired leases recovered every 5 s and retried 5 s after
    /// recovery. A relay that dies leaves its aggregates waiting at most lease + recovery
    /// interval + recovery delay = 25 s.
    pub fn new(instance_id: impl Into<String>) -> RelayConfig {
        RelayConfig {
            instance_id: instance_id.into(),
            batch_size: 200,
            lease: DEFAULT_LEASE,
            poll_interval: Duration::from_secs(1),
            linger: DEFAULT_LINGER,
            backoff: Backoff::default(),
            recovery_delay: DEFAULT_RECOVERY_DELAY,
            recover_interval: DEFAULT_RECOVER_INTERVAL,
            ordered: true,
            critical: HashSet::new(),
            cancel_exhausted: false,
            max_rate: None,
            metrics_interval: Duration::from_secs(15),
            outage_pause: Duration::from_secs(5),
            shutdown_grace: Duration::from_secs(5),
            messaging_spans: false,
            synchronous_commit: false,
        }
    }

    /// Events claimed per batch, from 1 to 5000 (a value outside is taken as the nearest):
    /// the marks of a batch bind a few values per event, and 5000 keeps every statement under
    /// SQLite's limit of bound values.
    pub fn batch_size(mut self, size: u32) -> Self {
        self.batch_size = size.clamp(1, 5000);
        self
    }

    /// How long a claim holds its events without renewal (15 s by default, at least 1 s). While
    /// a batch is in flight the relay renews its lease every third of this (the heartbeat), so a
    /// slow broker does not let it expire; a relay that cannot renew it (its database is
    /// unreachable) stops publishing the batch a fifth of the lease before it ends. So the lease
    /// bounds how long a dead relay's events wait, not how long a publish may take.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease.max(Duration::from_secs(1));
        self
    }

    /// The longest pause between tries while the broker is unavailable (5 s by default): the
    /// pause starts at a quarter of a second and doubles up to this. The events of a batch the
    /// broker did not answer for are given back with their attempt not counted.
    pub fn outage_pause(mut self, pause: Duration) -> Self {
        self.outage_pause = pause.max(OUTAGE_MIN_PAUSE);
        self
    }

    /// Opens an OpenTelemetry messaging span, `publish {destination}`, for each event around
    /// the broker call that publishes it (off by default; see [`crate::telemetry`]).
    pub fn messaging_spans(self, on: bool) -> Self {
        Self {
            messaging_spans: on,
            ..self
        }
    }

    /// How long [`Relay::run`](crate::Relay::run) still waits, once its shutdown completed, for
    /// the batch in flight to be acknowledged (5 s by default); what is not acknowledged by then
    /// is given back unpublished and published again by the next relay.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// Whether the relay's claims and marks wait for their commit to reach the disk
    /// (PostgreSQL's `synchronous_commit`, set for those transactions alone); `false` by
    /// default. MySQL and SQLite have no such setting per transaction: their relay writes always
    /// wait.
    ///
    /// Not waiting is safe for the three guarantees. A crash of the database server then loses
    /// the transactions that committed in its last moments (up to three times the server's
    /// `wal_writer_delay`, 600 ms by default), and only those: the server writes its log in
    /// order. What it loses of the relay's writes is a claim (the event is pending again), a
    /// mark, or the give-back of a batch the broker did not take (the event stays in progress
    /// until its lease is recovered), never an event, since the producer's commit that recorded
    /// it waits for the disk as always. Either way the event is published again, which consumers
    /// deduplicate on its eventId (and JetStream inside its duplicate window). Per-aggregate
    /// order holds: a later event of the aggregate was claimed after the earlier one was marked,
    /// so a crash that loses the mark loses that claim too. A failure's attempt count and lease
    /// renewals always wait for the disk. Set `true` to make claims and marks wait as well, at the
    /// cost of a flush (or, with a synchronous standby, a round trip to it) per claim and per
    /// mark.
    pub fn synchronous_commit(mut self, wait: bool) -> Self {
        self.synchronous_commit = wait;
        self
    }

    /// How long an idle relay sleeps between polls when nothing wakes it.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// How long a running relay lets events gather before it claims again after a batch that
    /// was not full (10 ms by default, at most a minute, `Duration::ZERO` for none): each claim
    /// then starts at least this long after the one before it. Under a steady stream of small
    /// commits every batch, and every chunk the consumers receive, costs a claim, a mark, a
    /// publish and a consumer transaction, whatever its length; waiting a few milliseconds
    /// lengthens the batches and so lowers the database's and the broker's work per event, at the
    /// cost of up to this much latency.
    ///
    /// It lingers only while it keeps up: not after a batch whose oldest event waited longer than
    /// a second, or twice the linger, from its commit to its claim (a backlog, where the next
    /// claim finds work at once, such as the later events of a few long aggregates). An event
    /// committed while the relay is idle is claimed at once, a full batch is followed by the
    /// next claim at once, [`Relay::drain`](crate::Relay::drain) never lingers, and a relay that
    /// is stopped while it lingers stops at once. While it lingers it keeps the connection of
    /// its last write for the next claim if the pool has another to spare (an idle one, or room
    /// to open one), and gives it back otherwise.
    pub fn linger(mut self, linger: Duration) -> Self {
        self.linger = linger.min(MAX_LINGER);
        self
    }

    /// Whether a batch whose oldest event waited `waited` from its commit to its claim was
    /// taken by a relay keeping up, after which it lingers (see [`Self::linger`]).
    pub(crate) fn keeping_up(&self, waited: Duration) -> bool {
        waited <= (self.linger * 2).max(Duration::from_secs(1))
    }

    /// When failed events are retried.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// How often expired leases are recovered (every 5 s by default), and how long after
    /// recovery they are retried (5 s by default).
    pub fn lease_recovery(mut self, every: Duration, retry_after: Duration) -> Self {
        self.recover_interval = every;
        self.recovery_delay = retry_after;
        self
    }

    /// Turns per-aggregate ordering off: events are published as soon as they are due, even
    /// while an earlier event of their aggregate is unpublished. More throughput for a single
    /// busy aggregate; consumers must then cope with reordering.
    ///
    /// Run unordered relays on an outbox table of their own, not beside ordered ones: on MySQL
    /// an ordered relay takes an event whose previous event is published as free to go, since
    /// ordered relays publish an event only after every earlier one, so an event an unordered
    /// relay published early lets its successors through.
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
