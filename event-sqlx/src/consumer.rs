//! Consumers (seed 003): every event applied once in effect through the inbox, failures sorted
//! into transient (retried with backoff), permanent (quarantined with what is needed to recover)
//! and bugs (the consumer stops and says why), and quarantined events replayed after a fix.

use std::fmt;

use chrono::{DateTime, Utc};
use event_core::{DomainEvent, EventEnvelope, Upcasters};
use sha2_free_digest::digest;
use sqlx::Pool;

use crate::backend::Backend;
use crate::outbox::now;
use crate::{Backoff, Handled, Inbox, InboxError, TableName};

/// How a handler failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandlerError {
    /// A dependency is down or slow: try again later.
    Transient(String),
    /// This event can never be processed as it is (bad input): quarantine it.
    Permanent(String),
    /// The code is wrong: stop consuming until it is fixed, then replay.
    Bug(String),
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandlerError::Transient(m) => write!(f, "transient: {m}"),
            HandlerError::Permanent(m) => write!(f, "permanent: {m}"),
            HandlerError::Bug(m) => write!(f, "bug: {m}"),
        }
    }
}

/// What processing a message did. Every outcome but an error means: acknowledge the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Processed {
    /// The handler ran and committed.
    Applied,
    /// Already consumed: the handler did not run.
    Duplicate,
    /// Not an event this consumer handles.
    Ignored,
    /// Could not be processed; it is in the quarantine with the reason.
    Quarantined(String),
    /// Older than an event already applied for its aggregate; recorded in the quarantine as
    /// `stale` (only with [`Consumer::reject_stale`]).
    Stale,
}

/// The consumer must stop: a handler reported a bug, or the database is gone. The message was
/// not acknowledged, so the broker delivers it again after the fix.
#[derive(Debug, thiserror::Error)]
#[error("consumer {consumer} stopped: {reason}")]
pub struct ConsumerStopped {
    /// The consumer.
    pub consumer: String,
    /// Why.
    pub reason: String,
}

/// A quarantined event, as stored.
#[derive(Debug, Clone, PartialEq)]
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
    /// `permanent`, `transient` (retries exhausted) or `stale`.
    pub failure_class: String,
    /// The last failure.
    pub reason: String,
    /// Failed attempts.
    pub retry_count: i32,
    /// Who recovers it.
    pub owner: Option<String>,
    /// Whether it was replayed.
    pub replayed: bool,
    /// First failure.
    pub first_failure_time: DateTime<Utc>,
    /// Last failure.
    pub last_failure_time: DateTime<Utc>,
    /// When it was replayed.
    pub replay_time: Option<DateTime<Utc>>,
}

#[doc(hidden)]
#[allow(unreachable_pub)] // unnameable outside: only the sealed Backend takes it
#[derive(Debug, Clone)]
pub struct NewQuarantine {
    pub(crate) consumer: String,
    pub(crate) consumer_version: String,
    pub(crate) event_id: String,
    pub(crate) event_type: Option<String>,
    pub(crate) body: String,
    pub(crate) failure_class: &'static str,
    pub(crate) reason: String,
    pub(crate) retry_count: i32,
    pub(crate) owner: Option<String>,
    pub(crate) now: DateTime<Utc>,
}

/// One consumer: its inbox, the upcasters it reads old versions with, its quarantine.
#[derive(Debug)]
pub struct Consumer<DB: Backend> {
    inbox: Inbox<DB>,
    version: String,
    upcasters: Upcasters,
    retries: Backoff,
    attempts: u32,
    owner: Option<String>,
    quarantine: TableName,
}

impl<DB: Backend> Consumer<DB> {
    /// The consumer `name` at `version` (recorded with quarantined events), with the upcasters
    /// registered in the program, and 3 attempts for transient failures (100 ms, 1 s backoff).
    pub fn new(
        pool: Pool<DB>,
        name: impl Into<String>,
        version: impl Into<String>,
    ) -> Consumer<DB> {
        Consumer {
            inbox: Inbox::new(pool, name),
            version: version.into(),
            upcasters: Upcasters::registered(),
            retries: Backoff::schedule([
                std::time::Duration::from_millis(100),
                std::time::Duration::from_secs(1),
            ]),
            attempts: 3,
            owner: None,
            quarantine: TableName::new("quarantined_event").unwrap_or_else(|_| unreachable!()),
        }
    }

    /// Reads old versions with these upcasters instead of the registered ones.
    pub fn upcasters(mut self, upcasters: Upcasters) -> Self {
        self.upcasters = upcasters;
        self
    }

    /// Tries a transiently failing handler `attempts` times, waiting per `backoff` in between,
    /// before quarantining the event.
    pub fn transient_retries(mut self, attempts: u32, backoff: Backoff) -> Self {
        self.attempts = attempts.max(1);
        self.retries = backoff;
        self
    }

    /// Refuses events older than one already applied for their aggregate, recording each in the
    /// quarantine (see [`Inbox::reject_stale`]).
    pub fn reject_stale(mut self) -> Self {
        self.inbox = self.inbox.reject_stale();
        self
    }

    /// Who recovers this consumer's quarantined events.
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// The consumer's name.
    pub fn name(&self) -> &str {
        self.inbox.consumer()
    }

    /// Processes one message body (the envelope's JSON) with `handler`, which gets the handler's
    /// transaction and the event as the newest version of `E`. `message_id` is the broker's id,
    /// used to name a body that cannot be read.
    pub async fn process<E: DomainEvent>(
        &self,
        body: &[u8],
        message_id: Option<&str>,
        handler: impl AsyncFn(&mut DB::Connection, E) -> Result<(), HandlerError>,
    ) -> Result<Processed, ConsumerStopped> {
        let envelope: EventEnvelope = match serde_json::from_slice(body) {
            Ok(envelope) => envelope,
            Err(e) => {
                let id = message_id
                    .map(str::to_owned)
                    .unwrap_or_else(|| digest(body));
                return self
                    .quarantine(
                        id,
                        None,
                        body,
                        "permanent",
                        format!("not an event envelope: {e}"),
                        1,
                    )
                    .await;
            }
        };
        if envelope.event_type != E::EVENT_TYPE {
            return Ok(Processed::Ignored);
        }
        let mut attempt = 0;
        loop {
            attempt += 1;
            let event: E = match self.upcasters.decode(&envelope) {
                Ok(event) => event,
                Err(e) => {
                    return self
                        .quarantine_envelope(&envelope, body, "permanent", e.to_string(), attempt)
                        .await;
                }
            };
            let outcome = self
                .inbox
                .handle(&envelope, async |tx: &mut DB::Connection| {
                    handler(tx, event).await
                })
                .await;
            let transient = match outcome {
                Ok(Handled::Applied(())) => return Ok(Processed::Applied),
                Ok(Handled::Duplicate) => return Ok(Processed::Duplicate),
                Ok(Handled::Stale { last_applied }) => {
                    let reason = format!(
                        "sequence {} of {} {} arrived after sequence {last_applied} was applied",
                        envelope.aggregate_sequence, envelope.aggregate_type, envelope.aggregate_id
                    );
                    self.quarantine_envelope(&envelope, body, "stale", reason, attempt)
                        .await?;
                    return Ok(Processed::Stale);
                }
                Err(InboxError::Handler(HandlerError::Bug(reason))) => {
                    return Err(ConsumerStopped {
                        consumer: self.name().to_owned(),
                        reason: format!(
                            "the handler reported a bug on {} ({}): {reason}",
                            envelope.event_id, envelope.event_type
                        ),
                    });
                }
                Err(InboxError::Handler(HandlerError::Permanent(reason))) => {
                    return self
                        .quarantine_envelope(&envelope, body, "permanent", reason, attempt)
                        .await;
                }
                Err(InboxError::Handler(HandlerError::Transient(reason))) => reason,
                Err(InboxError::Database { source, .. }) => source.to_string(),
            };
            if attempt >= self.attempts {
                return self
                    .quarantine_envelope(
                        &envelope,
                        body,
                        "transient",
                        format!("still failing after {attempt} attempts: {transient}"),
                        attempt,
                    )
                    .await;
            }
            tokio::time::sleep(self.retries.delay(attempt)).await;
        }
    }

    /// Quarantined events of this consumer, oldest first.
    pub async fn quarantined(&self, limit: u32) -> Result<Vec<QuarantineRecord>, sqlx::Error> {
        DB::quarantine_select(
            self.inbox.pool(),
            &self.quarantine,
            self.name(),
            0,
            i64::from(limit),
        )
        .await
    }

    /// Processes the quarantined events again with `handler` (after a fix), oldest first, and
    /// marks each one replayed once it is applied or found already applied. Idempotent: the inbox
    /// keeps a replayed event from having its effect twice. Returns how many were replayed.
    pub async fn replay<E: DomainEvent>(
        &self,
        limit: u32,
        handler: impl AsyncFn(&mut DB::Connection, E) -> Result<(), HandlerError>,
    ) -> Result<usize, ConsumerStopped> {
        self.replay_matching(limit, |_| true, handler).await
    }

    /// [`Consumer::replay`] for the quarantined events `filter` selects: one by its `event_id`,
    /// those of one event type, one failure class, a time range.
    pub async fn replay_matching<E: DomainEvent>(
        &self,
        limit: u32,
        filter: impl Fn(&QuarantineRecord) -> bool,
        handler: impl AsyncFn(&mut DB::Connection, E) -> Result<(), HandlerError>,
    ) -> Result<usize, ConsumerStopped> {
        let stopped = |e: sqlx::Error| ConsumerStopped {
            consumer: self.name().to_owned(),
            reason: format!("quarantine database error: {e}"),
        };
        let mut replayed = 0;
        for record in self
            .quarantined(limit)
            .await
            .map_err(stopped)?
            .into_iter()
            .filter(|r| filter(r))
        {
            let outcome = self
                .process::<E>(record.body.as_bytes(), Some(&record.event_id), &handler)
                .await?;
            if matches!(outcome, Processed::Applied | Processed::Duplicate) {
                DB::quarantine_mark_replayed(self.inbox.pool(), &self.quarantine, record.id, now())
                    .await
                    .map_err(stopped)?;
                replayed += 1;
            }
        }
        Ok(replayed)
    }

    /// Deletes inbox records older than `retention`, in batches of `batch`, and returns how many.
    /// Run it with a retention longer than any redelivery or replay window.
    pub async fn prune_inbox(
        &self,
        retention: std::time::Duration,
        batch: u32,
    ) -> Result<u64, sqlx::Error> {
        let before =
            now() - chrono::TimeDelta::from_std(retention).unwrap_or(chrono::TimeDelta::MAX);
        let mut total = 0;
        loop {
            let deleted = DB::prune_consumed(
                self.inbox.pool(),
                self.inbox.table_name(),
                before,
                i64::from(batch.max(1)),
            )
            .await?;
            total += deleted;
            if deleted < u64::from(batch.max(1)) {
                return Ok(total);
            }
        }
    }

    async fn quarantine_envelope(
        &self,
        envelope: &EventEnvelope,
        body: &[u8],
        class: &'static str,
        reason: String,
        attempts: u32,
    ) -> Result<Processed, ConsumerStopped> {
        self.quarantine(
            envelope.event_id.to_string(),
            Some(envelope.event_type.clone()),
            body,
            class,
            reason,
            attempts,
        )
        .await
    }

    async fn quarantine(
        &self,
        event_id: String,
        event_type: Option<String>,
        body: &[u8],
        class: &'static str,
        reason: String,
        attempts: u32,
    ) -> Result<Processed, ConsumerStopped> {
        let reason: String = reason.chars().take(1000).collect();
        let entry = NewQuarantine {
            consumer: self.name().to_owned(),
            consumer_version: self.version.clone(),
            event_id: event_id.chars().take(64).collect(),
            event_type,
            body: String::from_utf8_lossy(body).into_owned(),
            failure_class: class,
            reason: reason.clone(),
            retry_count: i32::try_from(attempts).unwrap_or(i32::MAX),
            owner: self.owner.clone(),
            now: now(),
        };
        DB::quarantine_upsert(self.inbox.pool(), &self.quarantine, &entry)
            .await
            .map_err(|e| ConsumerStopped {
                consumer: self.name().to_owned(),
                reason: format!("cannot quarantine {event_id}: {e}"),
            })?;
        tracing::warn!(consumer = self.name(), event_id = %entry.event_id, %reason, "event quarantined");
        Ok(Processed::Quarantined(reason))
    }
}

mod sha2_free_digest {
    /// A stable name for a body that is not an envelope: `body:` and 16 hex digits of FNV-1a.
    pub(super) fn digest(body: &[u8]) -> String {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in body {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        format!("body:{hash:016x}")
    }
}

impl<DB: Backend> Clone for Consumer<DB> {
    fn clone(&self) -> Self {
        Consumer {
            inbox: self.inbox.clone(),
            version: self.version.clone(),
            upcasters: self.upcasters.clone(),
            retries: self.retries.clone(),
            attempts: self.attempts,
            owner: self.owner.clone(),
            quarantine: self.quarantine.clone(),
        }
    }
}
