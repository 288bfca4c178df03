//! The relay: claims committed events under a lease, publishes them, and records the outcome.

use std::time::Duration;

use crate::config::relay::RelayConfig;
use crate::error::Error;
use crate::outbox::Outbox;
use crate::publisher::{OutboxMessage, PublishError, Publisher};
use crate::sql::dialect::Backend;
use crate::sql::outbox::{self as sql};
use crate::telemetry::Operation::Publish;

mod deliver;
mod run;

/// The first pause after the broker was found unavailable; it doubles up to
/// [`RelayConfig::outage_pause`].
const OUTAGE_FIRST_PAUSE: Duration = Duration::from_millis(250);

/// What one batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct BatchReport {
    /// Events claimed.
    pub claimed: usize,
    /// Events published and marked.
    pub published: usize,
    /// Events whose publish failed.
    pub failed: usize,
    /// Events published, whose lease had been taken over before they were marked: another relay
    /// may publish them again (consumers deduplicate on eventId).
    pub lease_lost: usize,
    /// Exhausted events cancelled (only with [`RelayConfig::cancel_exhausted`]).
    pub cancelled: usize,
    /// Events given back unpublished, their attempt not counted: the broker was unavailable
    /// ([`PublishError::unavailable`]), or the batch could not finish before its lease ended.
    pub deferred: usize,
}

impl std::ops::AddAssign for BatchReport {
    fn add_assign(&mut self, other: BatchReport) {
        self.claimed += other.claimed;
        self.published += other.published;
        self.failed += other.failed;
        self.lease_lost += other.lease_lost;
        self.cancelled += other.cancelled;
        self.deferred += other.deferred;
    }
}

/// Publishes committed outbox events.
///
/// Several relays may run against one database, in one process or many: a claim leases its
/// events to one relay (`locked_by`, `lock_until`), and per-aggregate order holds across relays.
#[derive(Debug)]
pub struct Relay<DB: Backend, P> {
    outbox: Outbox<DB>,
    publisher: P,
    config: RelayConfig,
    /// Set when [`Relay::run`]'s shutdown completed: the batch in flight has the shutdown grace
    /// left to be acknowledged.
    stopping: tokio::sync::watch::Sender<bool>,
    /// Whether this relay has read the server's binary log settings (see
    /// [`Relay::detect_claim_isolation`]).
    isolation_read: std::sync::atomic::AtomicBool,
}

impl<DB: Backend> Outbox<DB> {
    /// A relay publishing this outbox's events with `publisher`.
    pub fn relay<P: Publisher>(&self, publisher: P, config: RelayConfig) -> Relay<DB, P> {
        Relay {
            outbox: self.clone(),
            publisher,
            config,
            stopping: tokio::sync::watch::Sender::new(false),
            isolation_read: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl<DB: Backend, P: Publisher> Relay<DB, P> {
    /// The settings.
    pub fn config(&self) -> &RelayConfig {
        &self.config
    }

    /// The publisher.
    pub fn publisher(&self) -> &P {
        &self.publisher
    }

    /// Claims one batch, publishes it, and records the outcome. The claim is committed before
    /// publishing starts: no database lock is held while the broker is called.
    pub async fn run_once(&self) -> Result<BatchReport, Error> {
        let batch = self.claim().await?;
        self.deliver(batch).await
    }

    /// Publishes batch after batch until no event is claimable by anyone, and returns what was
    /// done; failed events whose retry is not yet due are left for later.
    ///
    /// While other relays hold live leases, it waits for them and claims again, since the
    /// events that follow theirs in each aggregate become claimable once they are published: of
    /// several relays draining one backlog, none returns while work it could share remains. A
    /// relay that died holds its leases until they expire; `drain` waits that long, and leaves
    /// the expired leases to [`Relay::recover_expired_leases`] ([`Relay::drain_recovering`]
    /// does both).
    ///
    /// On PostgreSQL and MySQL the next batch is claimed while a full one is published and
    /// marked, on a second connection; after a batch that was not full, and on SQLite, which has
    /// one writer, the next claim follows the delivery. On an error, a batch already claimed is
    /// still delivered before the error is returned, so no lease is left held.
    pub async fn drain(&self) -> Result<BatchReport, Error> {
        self.start().await;
        let mut total = BatchReport::default();
        let mut batch = self.claim().await?;
        loop {
            while !batch.is_empty() {
                let (next, delivered, overlapped) = self.deliver_and_claim(batch, false).await;
                match (delivered, next) {
                    (Ok(report), Ok(next)) => {
                        total += report;
                        batch = next;
                    }
                    (Err(e), Ok(next)) => {
                        if matches!(e, Error::BrokerUnavailable { .. }) {
                            self.give_back(&next, "broker unavailable; not published")
                                .await;
                        } else {
                            total += self.deliver(next).await.unwrap_or_default();
                        }
                        return Err(e);
                    }
                    (_, Err(e)) => return Err(e),
                }
                if batch.is_empty() && overlapped {
                    // That claim ran while the last batch was in flight, so it could not yet
                    // take the events that follow it in their aggregates.
                    batch = self.claim().await?;
                }
            }
            // This relay's claim found nothing. Done, unless another relay holds leases (the
            // events after theirs come free when they finish) or is claiming right now.
            if !self.work_remains().await? {
                return Ok(total);
            }
            tokio::select! {
                () = self.outbox.wakeup().notified() => {}
                () = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
            batch = self.claim().await?;
        }
    }

    /// Takes the outbox table's statistics when they are missing or stale, so that claims and
    /// marks use their indexes on a table just filled or filling; a failure is logged, not fatal.
    async fn prepare(&self) {
        if let Err(e) = self.outbox.ensure_statistics().await {
            tracing::warn!(error = %crate::error::Chain(&e), "could not check the outbox table's statistics; claims may be slow on a table just filled");
        }
    }

    /// What a relay does when it starts: [`Self::prepare`], a look at the indexes that bound
    /// the per-aggregate check ([`Outbox::detect_order_index`]), and on MySQL at whether claims
    /// can run without gap locks ([`Outbox::detect_claim_isolation`]).
    async fn start(&self) {
        self.prepare().await;
        self.detect_claim_isolation().await;
        match self.outbox.detect_order_index().await {
            Ok(sql::AggregateOrder::ProbePerStatus) if self.config.ordered => {
                tracing::debug!(relay = %self.config.instance_id, "the outbox table has an index leading with (aggregate_type, aggregate_id, publish_status): claims probe each unpublished status on it");
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(relay = %self.config.instance_id, error = %crate::error::Chain(&e), "could not read the outbox table's indexes; claims check each aggregate's order through its whole history");
            }
        }
    }

    /// Reads whether claims and lease recoveries may run without gap locks (see
    /// [`crate::Outbox::detect_claim_isolation`]); on failure they keep the server's default.
    /// Each start reads it again, and so does a lease recovery run before any start (as
    /// `eventctl relay --until-idle` runs one).
    pub(super) async fn detect_claim_isolation(&self) {
        self.isolation_read
            .store(true, std::sync::atomic::Ordering::Relaxed);
        if let Err(e) = self.outbox.detect_claim_isolation().await {
            tracing::warn!(relay = %self.config.instance_id, error = %crate::error::Chain(&e), "could not read the server's binary log format; claims keep its default isolation, and producers' inserts may wait for them");
        }
    }

    /// Whether an event is claimable now, by this relay or another, or another relay holds a
    /// live lease.
    async fn work_remains(&self) -> Result<bool, Error> {
        let mut conn = self.outbox.conn().await?;
        sql::work_remains::<DB>(
            &mut conn,
            &self.outbox.config().table,
            self.outbox.now(),
            self.outbox.aggregate_order(self.config.ordered),
            &self.config.instance_id,
        )
        .await
        .map_err(|e| self.outbox.db_error(e))
    }

    /// [`Relay::drain`] for a backlog a dead relay may have left, as `eventctl relay
    /// --until-idle` does: recovers the expired leases first, drains, then recovers the leases
    /// that expired meanwhile and drains again while there are some and they are due at once
    /// (a recovery delay of zero, [`RelayConfig::lease_recovery`]). With a recovery delay, the
    /// events recovered are due after it, for a later call or [`Relay::run`].
    pub async fn drain_recovering(&self) -> Result<BatchReport, Error> {
        self.recover_expired_leases().await?;
        let mut total = self.drain().await?;
        while self.recover_expired_leases().await? > 0 && self.config.recovery_delay.is_zero() {
            total += self.drain().await?;
        }
        Ok(total)
    }

    async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        if !self.config.messaging_spans {
            return self.publish_paced(messages).await;
        }
        let system = self.publisher.messaging_system();
        let spans: Vec<tracing::Span> = messages
            .iter()
            .map(|m| {
                let destination = self.publisher.destination(m);
                let traceparent = m.envelope.headers.traceparent.as_deref();
                let id = m.envelope.event_id.as_str();
                crate::telemetry::span(Publish, system, &destination, id, traceparent)
            })
            .collect();
        let results = match spans.as_slice() {
            [one] => {
                use tracing::Instrument;
                self.publish_paced(messages).instrument(one.clone()).await
            }
            _ => self.publish_paced(messages).await,
        };
        for (span, result) in spans.iter().zip(&results) {
            if let Err(e) = result {
                let kind = if e.is_unavailable() {
                    "unavailable"
                } else {
                    "rejected"
                };
                span.record("error.type", kind);
            }
        }
        results
    }

    async fn publish_paced(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        let Some(rate) = self.config.max_rate else {
            return self.publisher.publish(messages).await;
        };
        let pause = Duration::from_secs(1) / rate;
        let mut results = Vec::with_capacity(messages.len());
        for message in messages.chunks(1) {
            results.extend(self.publisher.publish(message).await);
            tokio::time::sleep(pause).await;
        }
        results
    }
}
