//! One message through a consumer: decode, upcast, route, the inbox check and the handler in one
//! transaction, per-aggregate order, and the classification of what went wrong.

use body_digest::digest;
use event_core::{DomainEvent, EventEnvelope};
use tracing::Instrument;

use crate::error::{Error, HandlerError};
use crate::inbox::{Guarded, Handled, InboxError, OrderCheck};
use crate::metrics;
use crate::route::{Delivered, Routes, UnknownEvents};
use crate::sql::dialect::Backend;
use crate::status::FailureClass;

use super::{Consumer, Processed, body_digest, parent_span_id};

impl<DB: Backend, R> Consumer<DB, R> {
    /// Processes one message body (the envelope's JSON) with `handler` alone, which gets the
    /// handler's transaction and the event as a [`Delivered`], the newest version of `E` with
    /// its envelope, as an `.on` handler does; other event types are
    /// ignored. `message_id` is the broker's id, used to name a body that cannot be read. For
    /// the consumer's own handlers, see [`Consumer::receive`].
    pub async fn process<E: DomainEvent>(
        &self,
        body: &[u8],
        message_id: Option<&str>,
        handler: impl AsyncFn(&mut DB::Connection, Delivered<E>) -> Result<(), HandlerError>,
    ) -> Result<Processed, Error> {
        self.process_with(
            body,
            message_id,
            &Self::single(&handler),
            UnknownEvents::Ignore,
            true,
        )
        .await
    }

    /// Processes one message body with `routes`; `ordered` applies the per-aggregate order
    /// guard (not to replays, which an operator asked for).
    pub(super) async fn process_with(
        &self,
        body: &[u8],
        message_id: Option<&str>,
        routes: &impl Routes<DB>,
        unknown: UnknownEvents,
        ordered: bool,
    ) -> Result<Processed, Error> {
        let envelope: EventEnvelope = match serde_json::from_slice(body) {
            Ok(envelope) => envelope,
            Err(e) => {
                let reason = format!("not an event envelope: {e}");
                return self.quarantine_unreadable(message_id, body, reason).await;
            }
        };
        let span = tracing::info_span!(
            "event.consume",
            consumer = self.name(),
            event_id = %envelope.event_id,
            event_type = %envelope.event_type,
            trace_id = envelope.trace_id.as_deref().unwrap_or(""),
            parent_id = parent_span_id(&envelope).unwrap_or(""),
        );
        let started = std::time::Instant::now();
        let outcome = self
            .handle_envelope(&envelope, body, routes, unknown, ordered)
            .instrument(span)
            .await;
        if let Ok(processed) = &outcome {
            let labels = [
                ("consumer", self.name().to_owned()),
                ("event_type", envelope.event_type.clone()),
                ("outcome", processed.name().to_owned()),
            ];
            ::metrics::counter!(metrics::CONSUMER_EVENTS, &labels).increment(1);
            ::metrics::histogram!(metrics::CONSUMER_HANDLE_SECONDS, "consumer" => self.name().to_owned())
                .record(started.elapsed().as_secs_f64());
        }
        outcome
    }

    /// Quarantines a body that cannot be read as an event, as a permanent failure for `reason`,
    /// named by the broker's `message_id` or else a digest of the body.
    pub(crate) async fn quarantine_unreadable(
        &self,
        message_id: Option<&str>,
        body: &[u8],
        reason: String,
    ) -> Result<Processed, Error> {
        let id = message_id
            .map(str::to_owned)
            .unwrap_or_else(|| digest(body));
        ::metrics::counter!(
            metrics::CONSUMER_EVENTS,
            "consumer" => self.name().to_owned(),
            "event_type" => "",
            "outcome" => "quarantined"
        )
        .increment(1);
        self.quarantine(id, None, body, FailureClass::Permanent, reason, 1)
            .await
    }

    /// The time on the consumer's clock.
    pub(crate) fn now(&self) -> chrono::DateTime<chrono::Utc> {
        self.inbox.now()
    }

    /// Handles a readable envelope: ignored, applied, a duplicate, stale, early, or
    /// quarantined.
    pub(super) async fn handle_envelope(
        &self,
        envelope: &EventEnvelope,
        body: &[u8],
        routes: &impl Routes<DB>,
        unknown: UnknownEvents,
        ordered: bool,
    ) -> Result<Processed, Error> {
        let handled = routes.handles(&envelope.event_type);
        let guarded = ordered && self.order.is_some();
        if !handled && unknown == UnknownEvents::Ignore && !guarded {
            // Unguarded, nothing to record.
            return Ok(Processed::Ignored);
        }
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut lost: Option<sqlx::Error> = None;
            let order = self.order_check(envelope).filter(|_| guarded);
            let outcome = self
                .inbox
                .handle_guarded(envelope, order, async |tx: &mut DB::Connection| {
                    if handled {
                        routes.dispatch(tx, envelope, &self.upcasters).await
                    } else if unknown == UnknownEvents::Quarantine {
                        Err(HandlerError::Permanent(format!(
                            "consumer {} has no handler for event type {}",
                            self.name(),
                            envelope.event_type
                        )))
                    } else {
                        // Recorded without an effect, so the next sequence finds this one.
                        Ok(())
                    }
                })
                .await;
            let transient = match outcome {
                Ok(Guarded {
                    handled: Handled::Applied(()),
                    gap,
                }) => {
                    self.waiting.done(envelope);
                    if let Some(last_applied) = gap {
                        self.report_gap(envelope, last_applied);
                    }
                    return Ok(if handled {
                        Processed::Applied
                    } else {
                        Processed::Ignored
                    });
                }
                Ok(Guarded {
                    handled: Handled::Duplicate,
                    ..
                }) => {
                    self.waiting.done(envelope);
                    return Ok(Processed::Duplicate);
                }
                Ok(Guarded {
                    handled: Handled::Early { last_applied },
                    ..
                }) => {
                    self.waiting.early(envelope, self.inbox.now());
                    let waits_for = last_applied.map_or(1, |last| last + 1);
                    tracing::debug!(
                        consumer = self.name(),
                        event_id = %envelope.event_id,
                        aggregate_type = %envelope.aggregate_type,
                        aggregate_id = %envelope.aggregate_id,
                        sequence = envelope.aggregate_sequence,
                        waits_for,
                        "event arrived before its predecessor; given back"
                    );
                    return Ok(Processed::Early { waits_for });
                }
                Ok(Guarded {
                    handled: Handled::Stale { last_applied },
                    ..
                }) => {
                    self.waiting.done(envelope);
                    let reason = format!(
                        "sequence {} of {} {} arrived after sequence {last_applied} was applied",
                        envelope.aggregate_sequence, envelope.aggregate_type, envelope.aggregate_id
                    );
                    self.quarantine_envelope(envelope, body, FailureClass::Stale, reason, attempt)
                        .await?;
                    return Ok(Processed::Stale);
                }
                Err(InboxError::Handler(bug @ HandlerError::Bug(_))) => {
                    return Err(Error::stopped(
                        self.name(),
                        format!(
                            "the handler reported a bug on {} ({})",
                            envelope.event_id, envelope.event_type
                        ),
                        bug,
                    ));
                }
                Err(InboxError::Handler(HandlerError::Permanent(reason))) => {
                    return self
                        .quarantine_envelope(
                            envelope,
                            body,
                            FailureClass::Permanent,
                            reason,
                            attempt,
                        )
                        .await;
                }
                Err(InboxError::Handler(HandlerError::Transient(reason))) => reason,
                Err(InboxError::Database { source, .. }) => {
                    let reason = source.to_string();
                    lost = crate::error::connection_lost(&source).then_some(source);
                    reason
                }
            };
            if attempt >= self.attempts {
                // A database that is down is not a failure of the event: nothing is
                // quarantined, the caller gives the event back and tries again later.
                if let Some(source) = lost.take() {
                    return Err(Error::database(self.inbox.table_name(), source));
                }
                self.database_answers().await?;
                return self
                    .quarantine_envelope(
                        envelope,
                        body,
                        FailureClass::Transient,
                        format!("still failing after {attempt} attempts: {transient}"),
                        attempt,
                    )
                    .await;
            }
            self.inbox.sleep(self.retries.delay(attempt)).await;
        }
    }

    /// Whether the database answers, asked before a transiently failing event is quarantined:
    /// a handler that failed because its connection broke is not at fault, and its event is
    /// given back (the error is transient) rather than quarantined.
    pub(super) async fn database_answers(&self) -> Result<(), Error> {
        let probe = async {
            let mut conn = self.inbox.pool().acquire().await?;
            crate::sql::dialect::Sql::<DB>::new("SELECT 1")
                .execute(&mut *conn)
                .await
        };
        match tokio::time::timeout(std::time::Duration::from_secs(10), probe).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(Error::database(self.inbox.table_name(), e)),
            Err(_) => Err(Error::database(
                self.inbox.table_name(),
                sqlx::Error::PoolTimedOut,
            )),
        }
    }

    /// The order guard for `envelope`, if this consumer keeps order: what this process settled
    /// of its aggregate, and whether it waited long enough to be applied without its
    /// predecessor.
    pub(super) fn order_check(&self, envelope: &EventEnvelope) -> Option<OrderCheck> {
        let wait = self.order?;
        Some(self.waiting.check(envelope, self.inbox.now(), wait))
    }

    /// Says that `envelope` was applied without its predecessor, which did not come in time.
    pub(super) fn report_gap(&self, envelope: &EventEnvelope, last_applied: Option<u64>) {
        ::metrics::counter!(metrics::CONSUMER_ORDER_GAPS, "consumer" => self.name().to_owned())
            .increment(1);
        let wait = self.order.unwrap_or_default();
        tracing::warn!(
            consumer = self.name(),
            event_id = %envelope.event_id,
            "applied sequence {} of {} {} without sequence {}, which did not arrive within {:?}; \
             if this consumer does not receive every event of the aggregate, build it without \
             `.in_order()`",
            envelope.aggregate_sequence,
            envelope.aggregate_type,
            envelope.aggregate_id,
            last_applied.map_or(1, |last| last + 1),
            wait,
        );
    }
}

impl<DB: Backend, R: Routes<DB>> Consumer<DB, R> {
    /// Processes one message body (the envelope's JSON) with the consumer's handlers.
    /// `message_id` is the broker's id, used to name a body that cannot be read.
    pub async fn receive(&self, body: &[u8], message_id: Option<&str>) -> Result<Processed, Error> {
        self.process_with(body, message_id, &self.routes, self.unknown, true)
            .await
    }
}
