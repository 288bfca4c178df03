//! Consumers (seed 003): every event applied once in effect through the inbox, failures sorted
//! into transient (retried with backoff), permanent (quarantined with what is needed to recover)
//! and bugs (the consumer stops and says why), and quarantined events replayed after a fix.

use event_core::{DomainEvent, EventEnvelope, Upcasters};
use sqlx::Pool;

use crate::clock::Clock;
use crate::config::backoff::Backoff;
use crate::error::{Error, HandlerError};
use crate::inbox::{Guarded, Handled, Inbox, InboxError, OrderCheck, in_sequence};
use crate::route::{Delivered, NoRoutes, On, OnBatch, Routes, UnknownEvents};
use crate::row::quarantine::{NewQuarantine, QuarantineFilter, QuarantineRecord};
use crate::sql::dialect::Backend;
use crate::sql::inbox::{self as sql, Selection};
use crate::status::{FailureClass, QuarantineStatus};
use crate::table::TableName;
use body_digest::digest;
use tracing::Instrument;

use crate::metrics;

/// The producer's span id from the envelope's `traceparent`, which the consumer's span
/// continues: the consume span carries the same trace id, with the producer's span as parent.
fn parent_span_id(envelope: &EventEnvelope) -> Option<&str> {
    let traceparent = envelope.headers.traceparent.as_deref()?;
    traceparent.split('-').nth(2).filter(|id| id.len() == 16)
}

/// What processing a message did. Every outcome but [`Processed::Early`] means: acknowledge the
/// message.
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
    /// Arrived before the previous sequence of its aggregate was applied: not applied and not
    /// recorded. Do not acknowledge it: give it back to the broker to be delivered again a
    /// little later (the subscriptions do). See [`Consumer::order_wait`].
    Early {
        /// The sequence the event waits for.
        waits_for: u64,
    },
}

impl Processed {
    /// A lowercase name, the `outcome` label of the consumer metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Processed::Applied => "applied",
            Processed::Duplicate => "duplicate",
            Processed::Ignored => "ignored",
            Processed::Quarantined(_) => "quarantined",
            Processed::Stale => "stale",
            Processed::Early { .. } => "early",
        }
    }
}

/// One message of a batch for [`Consumer::receive_batch`]: its body (the envelope's JSON) and
/// the broker's id for it, used to name a body that cannot be read.
#[derive(Debug, Clone, Copy)]
pub struct Received<'a> {
    /// The message body.
    pub body: &'a [u8],
    /// The broker's message id, if it has one.
    pub message_id: Option<&'a str>,
}

/// How a batch transaction ended.
enum BatchRun {
    /// Committed: the outcome of each event, in order.
    Committed(Vec<Processed>),
    /// The handler of the event at this index failed; nothing was committed.
    FailedAt(usize),
    /// A batch handler failed on the events in this range (some event of it); nothing was
    /// committed.
    FailedRun(usize, usize),
}

/// One consumer: its handlers, one per event type, its inbox, the upcasters it reads old versions
/// with, its quarantine.
///
/// ```no_run
/// # #[cfg(feature = "sqlite")]
/// # async fn demo(pool: sqlx::SqlitePool, body: &[u8]) -> Result<(), event_sqlx::Error> {
/// # #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, event_core::DomainEvent)]
/// # struct OrderPlaced { order_id: String }
/// # #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, event_core::DomainEvent)]
/// # struct OrderPaid { order_id: String }
/// use event_sqlx::{Consumer, Delivered};
///
/// let consumer = Consumer::new(pool, "billing", "1.0.0")
///     .on(async |tx: &mut sqlx::SqliteConnection, placed: Delivered<OrderPlaced>| {
///         sqlx::query("INSERT INTO bill (order_id) VALUES (?)")
///             .bind(&placed.order_id)
///             .execute(&mut *tx)
///             .await?;
///         Ok(())
///     })
///     .on(async |tx: &mut sqlx::SqliteConnection, paid: Delivered<OrderPaid>| {
///         sqlx::query("UPDATE bill SET paid = 1 WHERE order_id = ?")
///             .bind(&paid.order_id)
///             .execute(&mut *tx)
///             .await?;
///         Ok(())
///     });
/// // A subscription feeds it; or, for any transport, one message body at a time:
/// consumer.receive(body, None).await?;
/// # Ok(()) }
/// ```
pub struct Consumer<DB: Backend, R = NoRoutes> {
    inbox: Inbox<DB>,
    version: String,
    upcasters: Upcasters,
    retries: Backoff,
    attempts: u32,
    owner: Option<String>,
    quarantine: TableName,
    routes: R,
    unknown: UnknownEvents,
    order: Option<std::time::Duration>,
    waiting: std::sync::Arc<order::Waiting>,
}

/// How long an early event waits for its aggregate's previous sequence, by default.
const ORDER_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

impl<DB: Backend> Consumer<DB> {
    /// The consumer `name` at `version` (recorded with quarantined events), with the upcasters
    /// registered in the program, and 3 attempts for transient failures (100 ms, 1 s backoff).
    /// Events are applied as they arrive; [`Consumer::in_order`] applies each aggregate's
    /// events in sequence whatever the broker redelivers.
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
            routes: NoRoutes,
            unknown: UnknownEvents::Ignore,
            order: None,
            waiting: std::sync::Arc::default(),
        }
    }
}

impl<DB: Backend, R> Consumer<DB, R> {
    /// Handles events of type `E` with `handler`, which runs in the transaction that records the
    /// event in the inbox and gets the event as a [`Delivered`]: the newest version of `E` (older
    /// ones upcast) and its envelope. Add one handler per event type; what arrives for a type
    /// without one follows [`Consumer::unknown_events`].
    ///
    /// Its errors decide what happens to the event: see [`HandlerError`].
    ///
    /// Keep the consumer's concrete type where it is spawned (build it in place, or in a
    /// macro): returned from a function as `Consumer<DB, impl Routes<DB>>`, it hides whether
    /// its handlers' futures are `Send`, and `tokio::spawn` refuses it.
    pub fn on<E, H>(self, handler: H) -> Consumer<DB, On<E, H, R>>
    where
        E: event_core::DomainEvent,
        H: AsyncFn(&mut DB::Connection, Delivered<E>) -> Result<(), HandlerError>,
    {
        self.map_routes(|routes| On::new(handler, routes))
    }

    /// Handles events of type `E` a batch at a time with `handler`, which gets every event of
    /// that type that arrived together, in order, in one call (one multi-row write instead of
    /// one statement per event), inside the transaction that records them in the inbox. Only
    /// [`Consumer::receive_batch`] (a subscription's `.batch(n)`) gathers events; elsewhere the
    /// handler gets one at a time.
    ///
    /// When it fails, the batch is rolled back and split in halves, each tried in its own
    /// transaction, until the failing event is alone: it then takes the one-event path
    /// (retried, quarantined, or the consumer stopped), and order per aggregate holds.
    pub fn on_batch<E, H>(self, handler: H) -> Consumer<DB, OnBatch<E, H, R>>
    where
        E: event_core::DomainEvent,
        H: AsyncFn(&mut DB::Connection, Vec<Delivered<E>>) -> Result<(), HandlerError>,
    {
        self.map_routes(|routes| OnBatch::new(handler, routes))
    }

    /// The same consumer with its handlers wrapped by `wrap`.
    fn map_routes<R2>(self, wrap: impl FnOnce(R) -> R2) -> Consumer<DB, R2> {
        Consumer {
            inbox: self.inbox,
            version: self.version,
            upcasters: self.upcasters,
            retries: self.retries,
            attempts: self.attempts,
            owner: self.owner,
            quarantine: self.quarantine,
            routes: wrap(self.routes),
            unknown: self.unknown,
            order: self.order,
            waiting: self.waiting,
        }
    }

    /// What to do with an event of a type no handler takes: acknowledge and skip it (the
    /// default), or quarantine it.
    pub fn unknown_events(mut self, policy: UnknownEvents) -> Self {
        self.unknown = policy;
        self
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

    /// Applies an aggregate's event only after the previous sequence of that aggregate was
    /// applied (or quarantined by this consumer, which settles it), whatever the broker
    /// redelivers: for a consumer that receives every event of its aggregates.
    ///
    /// An event that arrives early (a redelivery overtaken by newer messages of its aggregate)
    /// is not applied and not recorded: it is given back to the broker ([`Processed::Early`])
    /// and tried again a little later, while other aggregates go on. Every event the consumer
    /// receives is recorded in its inbox, those without a handler too, so that the sequences it
    /// sees have no holes. An event whose predecessor does not come within 5 minutes (see
    /// [`Consumer::order_wait`]) is applied anyway, with a warning and the
    /// `event_consumer_order_gaps_total` metric.
    ///
    /// The guard needs every event of each aggregate: a subscription that receives only some
    /// event types of an aggregate (a subject filter, a binding key), or one that starts in
    /// the middle of a stream, would see holes and wait at each. Leave it off there: events are
    /// then applied in the order the broker delivers them.
    pub fn in_order(mut self) -> Self {
        self.order = Some(self.order.unwrap_or(ORDER_WAIT));
        self
    }

    /// [`Consumer::in_order`], with `wait` as the longest an early event waits for its
    /// predecessor (5 minutes by default). Keep it longer than the broker takes to deliver
    /// again what a dead consumer held: JetStream's ack wait, RabbitMQ's heartbeat timeout.
    pub fn order_wait(mut self, wait: std::time::Duration) -> Self {
        self.order = Some(wait);
        self
    }

    /// Reads the time from `clock` instead of the system clock: inbox and quarantine times, the
    /// order guard's wait, and the pause between transient retries ([`Clock::sleep`]; see
    /// [`ManualClock`]).
    ///
    /// [`ManualClock`]: crate::ManualClock
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.inbox = self.inbox.clock(clock);
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

    /// Processes one message body (the envelope's JSON) with `handler` alone, which gets the
    /// handler's transaction and the event as the newest version of `E`; other event types are
    /// ignored. `message_id` is the broker's id, used to name a body that cannot be read. For
    /// the consumer's own handlers, see [`Consumer::receive`].
    pub async fn process<E: DomainEvent>(
        &self,
        body: &[u8],
        message_id: Option<&str>,
        handler: impl AsyncFn(&mut DB::Connection, E) -> Result<(), HandlerError>,
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
    async fn process_with(
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
                return self
                    .quarantine(
                        id,
                        None,
                        body,
                        FailureClass::Permanent,
                        format!("not an event envelope: {e}"),
                        1,
                    )
                    .await;
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

    /// Handles a readable envelope: ignored, applied, a duplicate, stale, early, or
    /// quarantined.
    async fn handle_envelope(
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
    async fn database_answers(&self) -> Result<(), Error> {
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
    fn order_check(&self, envelope: &EventEnvelope) -> Option<OrderCheck> {
        let wait = self.order?;
        Some(self.waiting.check(envelope, self.inbox.now(), wait))
    }

    /// Says that `envelope` was applied without its predecessor, which did not come in time.
    fn report_gap(&self, envelope: &EventEnvelope, last_applied: Option<u64>) {
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

    /// Quarantined events of this consumer, oldest first.
    pub async fn quarantined(&self, limit: u32) -> Result<Vec<QuarantineRecord>, Error> {
        self.quarantine_page(
            QuarantineStatus::Quarantined,
            &QuarantineFilter::default(),
            0,
            limit,
        )
        .await
    }

    /// Entries of this consumer's quarantine in `status` (still quarantined, or replayed) that
    /// `filter` selects, oldest first, at most `limit`.
    pub async fn quarantine_entries(
        &self,
        status: QuarantineStatus,
        filter: &QuarantineFilter<'_>,
        limit: u32,
    ) -> Result<Vec<QuarantineRecord>, Error> {
        self.quarantine_page(status, filter, 0, limit).await
    }

    /// Processes the oldest `limit` quarantined events again with `handler` (after a fix), and
    /// marks each one replayed once it is applied or found already applied. Idempotent: the inbox
    /// keeps a replayed event from having its effect twice. Returns how many were replayed.
    pub async fn replay<E: DomainEvent>(
        &self,
        limit: u32,
        handler: impl AsyncFn(&mut DB::Connection, E) -> Result<(), HandlerError>,
    ) -> Result<usize, Error> {
        let page = self.quarantined(limit).await?;
        self.replay_records(page, &Self::single(&handler)).await
    }

    /// [`Consumer::replay`] for every quarantined event that `filter` selects (one by its
    /// `event_id`, those of one event type, one failure class, a time range), however many
    /// there are: the database selects them, a page at a time.
    pub async fn replay_matching<E: DomainEvent>(
        &self,
        filter: &QuarantineFilter<'_>,
        handler: impl AsyncFn(&mut DB::Connection, E) -> Result<(), HandlerError>,
    ) -> Result<usize, Error> {
        self.replay_with(
            QuarantineStatus::Quarantined,
            filter,
            &Self::single(&handler),
        )
        .await
    }

    /// A route for one ad hoc handler that takes the payload alone.
    fn single<E: DomainEvent>(
        handler: &impl AsyncFn(&mut DB::Connection, E) -> Result<(), HandlerError>,
    ) -> impl Routes<DB> {
        On::new(
            async move |tx: &mut DB::Connection, delivered: Delivered<E>| {
                handler(tx, delivered.event).await
            },
            NoRoutes,
        )
    }

    async fn replay_with(
        &self,
        status: QuarantineStatus,
        filter: &QuarantineFilter<'_>,
        routes: &impl Routes<DB>,
    ) -> Result<usize, Error> {
        const PAGE: u32 = 100;
        let (mut replayed, mut after_id) = (0, 0);
        loop {
            let page = self.quarantine_page(status, filter, after_id, PAGE).await?;
            let Some(last) = page.last() else {
                return Ok(replayed);
            };
            after_id = last.id;
            let full = page.len() == PAGE as usize;
            replayed += self.replay_records(page, routes).await?;
            if !full {
                return Ok(replayed);
            }
        }
    }

    async fn replay_records(
        &self,
        records: Vec<QuarantineRecord>,
        routes: &impl Routes<DB>,
    ) -> Result<usize, Error> {
        let mut replayed = 0;
        for record in records {
            let outcome = self
                .process_with(
                    record.body.as_bytes(),
                    Some(&record.event_id),
                    routes,
                    UnknownEvents::Ignore,
                    false,
                )
                .await?;
            let mut conn = self.conn().await?;
            match outcome {
                Processed::Applied | Processed::Duplicate => {
                    sql::mark_replayed::<DB>(
                        &mut conn,
                        &self.quarantine,
                        record.id,
                        self.inbox.now(),
                    )
                    .await
                    .map_err(|e| Error::database(&self.quarantine, e))?;
                    replayed += 1;
                }
                // Requeued for a consumer that has no handler for it: back to the quarantine,
                // saying why, rather than requeued for ever.
                Processed::Ignored if record.status == QuarantineStatus::Requeued => {
                    let reason = format!(
                        "requeued, but consumer {} has no handler for event type {}; it stays quarantined",
                        self.name(),
                        record.event_type.as_deref().unwrap_or("(unreadable)")
                    );
                    sql::unrequeue::<DB>(
                        &mut conn,
                        &self.quarantine,
                        record.id,
                        &reason,
                        self.inbox.now(),
                    )
                    .await
                    .map_err(|e| Error::database(&self.quarantine, e))?;
                }
                _ => {}
            }
        }
        Ok(replayed)
    }

    async fn quarantine_page(
        &self,
        status: QuarantineStatus,
        filter: &QuarantineFilter<'_>,
        after_id: i64,
        limit: u32,
    ) -> Result<Vec<QuarantineRecord>, Error> {
        let selection = Selection {
            consumer: Some(self.name()),
            status: Some(status),
            filter: *filter,
        };
        let mut conn = self.conn().await?;
        sql::select_quarantined::<DB>(
            &mut conn,
            &self.quarantine,
            &selection,
            after_id,
            i64::from(limit),
        )
        .await
        .map_err(|e| Error::database(&self.quarantine, e))
    }

    async fn conn(&self) -> Result<sqlx::pool::PoolConnection<DB>, Error> {
        self.inbox
            .pool()
            .acquire()
            .await
            .map_err(|e| Error::database(&self.quarantine, e))
    }

    /// Deletes this consumer's inbox records older than `retention`, in batches of `batch`, and
    /// returns how many (see [`Inbox::prune`]).
    pub async fn prune_inbox(
        &self,
        retention: std::time::Duration,
        batch: u32,
    ) -> Result<u64, Error> {
        self.inbox.prune(retention, batch).await
    }

    async fn quarantine_envelope(
        &self,
        envelope: &EventEnvelope,
        body: &[u8],
        class: FailureClass,
        reason: String,
        attempts: u32,
    ) -> Result<Processed, Error> {
        let quarantined = self
            .quarantine(
                envelope.event_id.to_string(),
                Some(envelope.event_type.clone()),
                body,
                class,
                reason,
                attempts,
            )
            .await?;
        // A quarantined event settles its aggregate's order: the next sequence goes on.
        self.waiting.settle(envelope);
        Ok(quarantined)
    }

    async fn quarantine(
        &self,
        event_id: String,
        event_type: Option<String>,
        body: &[u8],
        class: FailureClass,
        reason: String,
        attempts: u32,
    ) -> Result<Processed, Error> {
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
            now: self.inbox.now(),
        };
        let mut conn = self.conn().await?;
        sql::quarantine::<DB>(&mut conn, &self.quarantine, &entry)
            .await
            .map_err(|e| {
                Error::stopped(
                    self.name(),
                    format!("cannot quarantine {event_id}"),
                    Error::database(&self.quarantine, e),
                )
            })?;
        tracing::warn!(consumer = self.name(), event_id = %entry.event_id, %reason, "event quarantined");
        Ok(Processed::Quarantined(reason))
    }
}

mod order {
    use std::collections::HashMap;
    use std::sync::{Mutex, PoisonError};

    use chrono::{DateTime, Utc};
    use event_core::EventEnvelope;

    use crate::inbox::OrderCheck;

    /// At most this many events waiting, and aggregates settled, are remembered; past it the
    /// oldest memory goes (a wait starts again, a settled sequence waits for the bound).
    const CAPACITY: usize = 100_000;

    /// What a consumer remembers for its order guard: when each early event was first given
    /// back, and the sequences of aggregates it settled by quarantining them.
    #[derive(Debug, Default)]
    pub(super) struct Waiting {
        state: Mutex<State>,
    }

    #[derive(Debug, Default)]
    struct State {
        first_early: HashMap<String, DateTime<Utc>>,
        settled: HashMap<(String, String), u64>,
    }

    fn key(envelope: &EventEnvelope) -> (String, String) {
        (
            envelope.aggregate_type.clone(),
            envelope.aggregate_id.clone(),
        )
    }

    impl Waiting {
        fn state(&self) -> std::sync::MutexGuard<'_, State> {
            self.state.lock().unwrap_or_else(PoisonError::into_inner)
        }

        pub(super) fn check(
            &self,
            envelope: &EventEnvelope,
            now: DateTime<Utc>,
            wait: std::time::Duration,
        ) -> OrderCheck {
            let state = self.state();
            let settled = if state.settled.is_empty() {
                None
            } else {
                state.settled.get(&key(envelope)).copied()
            };
            let accept_gap = state
                .first_early
                .get(envelope.event_id.as_str())
                .is_some_and(|first| (now - *first).to_std().unwrap_or_default() >= wait);
            OrderCheck {
                settled,
                accept_gap,
            }
        }

        pub(super) fn early(&self, envelope: &EventEnvelope, now: DateTime<Utc>) {
            let mut state = self.state();
            if state.first_early.len() >= CAPACITY
                && !state.first_early.contains_key(envelope.event_id.as_str())
            {
                forget_oldest(&mut state.first_early);
            }
            state
                .first_early
                .entry(envelope.event_id.to_string())
                .or_insert(now);
        }

        pub(super) fn done(&self, envelope: &EventEnvelope) {
            let mut state = self.state();
            if !state.first_early.is_empty() {
                state.first_early.remove(envelope.event_id.as_str());
            }
        }

        pub(super) fn settle(&self, envelope: &EventEnvelope) {
            let mut state = self.state();
            state.first_early.remove(envelope.event_id.as_str());
            if state.settled.len() >= CAPACITY {
                state.settled.clear();
            }
            let settled = state.settled.entry(key(envelope)).or_insert(0);
            *settled = (*settled).max(envelope.aggregate_sequence);
        }
    }

    /// Drops the older half of the waits.
    fn forget_oldest(first_early: &mut HashMap<String, DateTime<Utc>>) {
        let mut times: Vec<DateTime<Utc>> = first_early.values().copied().collect();
        times.sort_unstable();
        if let Some(&cut) = times.get(times.len() / 2) {
            first_early.retain(|_, first| *first > cut);
        }
    }
}

mod body_digest {
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

impl<DB: Backend, R: Routes<DB>> Consumer<DB, R> {
    /// Processes one message body (the envelope's JSON) with the consumer's handlers.
    /// `message_id` is the broker's id, used to name a body that cannot be read.
    pub async fn receive(&self, body: &[u8], message_id: Option<&str>) -> Result<Processed, Error> {
        self.process_with(body, message_id, &self.routes, self.unknown, true)
            .await
    }

    /// Processes a batch of messages in as few transactions as it can, and returns the outcome of
    /// each, in order; acknowledge them all when it returns `Ok`.
    ///
    /// The events are recorded in the inbox with one multi-row insert, which tells which were
    /// consumed before (those are duplicates, their handler does not run); each new event's
    /// handler then runs in order in the same transaction, and one commit ends it. A failing
    /// handler does not poison its batch: the transaction is rolled back, the events before it
    /// are applied again in a batch of their own, the failing one goes down the one-event path
    /// (retried if transient, quarantined if permanent, the consumer stopped if a bug), and the
    /// rest continue in a new batch, so the order of each aggregate's events holds. A database
    /// error on the batch, or a concurrent consumer of the same name on MySQL, falls back to one
    /// event at a time.
    ///
    /// Bodies that are not envelopes, and events no handler takes, are handled one by one as by
    /// [`Consumer::receive`]; so is every event of a consumer that [rejects stale
    /// events](Consumer::reject_stale), whose guard reads the aggregate's last applied sequence
    /// before each event.
    ///
    /// On `Err` (a bug, or a database down for longer than the retries), do not acknowledge the
    /// batch: what was committed before the error is found a duplicate when delivered again.
    pub async fn receive_batch(&self, messages: &[Received<'_>]) -> Result<Vec<Processed>, Error> {
        if let [one] = messages {
            return Ok(vec![self.receive(one.body, one.message_id).await?]);
        }
        let mut outcomes: Vec<Option<Processed>> = vec![None; messages.len()];
        let mut batch: Vec<(usize, EventEnvelope)> = Vec::with_capacity(messages.len());
        let mut ids = std::collections::HashSet::with_capacity(messages.len());
        for (i, message) in messages.iter().enumerate() {
            match serde_json::from_slice::<EventEnvelope>(message.body) {
                Ok(envelope)
                    if self.batches(&envelope.event_type) && !self.inbox.rejects_stale() =>
                {
                    if ids.insert(envelope.event_id.to_string()) {
                        batch.push((i, envelope));
                    } else {
                        // The same event twice in one batch: the first occurrence decides.
                        outcomes[i] = Some(Processed::Duplicate);
                    }
                }
                _ => outcomes[i] = Some(self.receive(message.body, message.message_id).await?),
            }
        }
        let span = tracing::info_span!(
            "event.consume_batch",
            consumer = self.name(),
            size = batch.len()
        );
        self.apply_batch(&batch, messages, &mut outcomes)
            .instrument(span)
            .await?;
        Ok(outcomes
            .into_iter()
            .map(|outcome| outcome.unwrap_or(Processed::Ignored))
            .collect())
    }

    /// Applies `batch` (readable envelopes this consumer handles, with their index in
    /// `messages`), splitting it at each failing event.
    async fn apply_batch(
        &self,
        batch: &[(usize, EventEnvelope)],
        messages: &[Received<'_>],
        outcomes: &mut [Option<Processed>],
    ) -> Result<(), Error> {
        let mut rest = batch;
        while !rest.is_empty() {
            let started = std::time::Instant::now();
            let run = match self.try_batch(rest).await {
                Ok(run) => run,
                Err(e) => {
                    tracing::debug!(consumer = self.name(), error = %e, "batch failed on the database; one event at a time");
                    return self.one_by_one(rest, messages, outcomes).await;
                }
            };
            match run {
                BatchRun::Committed(processed) => {
                    self.count_batch(rest, &processed, started);
                    for ((i, _), outcome) in rest.iter().zip(processed) {
                        outcomes[*i] = Some(outcome);
                    }
                    return Ok(());
                }
                BatchRun::FailedRun(a, b) => {
                    let (before, tail) = rest.split_at(a);
                    self.commit_before(before, messages, outcomes, started)
                        .await?;
                    let (run, after) = tail.split_at(b - a);
                    self.bisect(run, messages, outcomes).await?;
                    rest = after;
                }
                BatchRun::FailedAt(k) => {
                    let (before, failing) = rest.split_at(k);
                    self.commit_before(before, messages, outcomes, started)
                        .await?;
                    let (i, _) = &failing[0];
                    let message = &messages[*i];
                    outcomes[*i] = Some(self.receive(message.body, message.message_id).await?);
                    rest = &failing[1..];
                }
            }
        }
        Ok(())
    }

    /// Applies the events before a failure again, as a batch of their own.
    async fn commit_before(
        &self,
        before: &[(usize, EventEnvelope)],
        messages: &[Received<'_>],
        outcomes: &mut [Option<Processed>],
        started: std::time::Instant,
    ) -> Result<(), Error> {
        if before.is_empty() {
            return Ok(());
        }
        match self.try_batch(before).await {
            Ok(BatchRun::Committed(processed)) => {
                self.count_batch(before, &processed, started);
                for ((i, _), outcome) in before.iter().zip(processed) {
                    outcomes[*i] = Some(outcome);
                }
                Ok(())
            }
            // Failed on a second run where it passed the first: a handler that is not
            // deterministic, or the database. One at a time, then.
            _ => self.one_by_one(before, messages, outcomes).await,
        }
    }

    /// Isolates the failing event of a batch handler's run: halves, each in its own
    /// transaction, in order, until a failing event is alone; that one takes the one-event path.
    async fn bisect(
        &self,
        run: &[(usize, EventEnvelope)],
        messages: &[Received<'_>],
        outcomes: &mut [Option<Processed>],
    ) -> Result<(), Error> {
        // Ranges still to apply, the next one last.
        let mut ranges = vec![(0, run.len())];
        while let Some((lo, hi)) = ranges.pop() {
            let part = &run[lo..hi];
            if part.len() == 1 {
                self.one_by_one(part, messages, outcomes).await?;
                continue;
            }
            let started = std::time::Instant::now();
            match self.try_batch(part).await {
                Ok(BatchRun::Committed(processed)) => {
                    self.count_batch(part, &processed, started);
                    for ((i, _), outcome) in part.iter().zip(processed) {
                        outcomes[*i] = Some(outcome);
                    }
                }
                _ => {
                    let mid = lo + part.len() / 2;
                    ranges.push((mid, hi));
                    ranges.push((lo, mid));
                }
            }
        }
        Ok(())
    }

    /// Whether events of `event_type` go into a batch transaction: those a handler takes, and,
    /// when the order guard is on, those recorded without an effect.
    fn batches(&self, event_type: &str) -> bool {
        self.routes.handles(event_type)
            || (self.order.is_some() && self.unknown == UnknownEvents::Ignore)
    }

    /// Which events of a batch the order guard lets through: each aggregate's applied sequence
    /// read once, then carried along the batch. Returns the indices of those ready, and marks
    /// the others early in `processed`; `gaps` gets those applied past a missing predecessor.
    async fn order_batch(
        &self,
        tx: &mut DB::Connection,
        envelopes: &[&EventEnvelope],
        processed: &mut [Processed],
        gaps: &mut Vec<(usize, Option<u64>)>,
    ) -> Result<Vec<usize>, sqlx::Error> {
        use std::collections::HashMap;
        let mut aggregates: Vec<(&str, &str)> = envelopes
            .iter()
            .filter(|e| e.aggregate_sequence > 1)
            .map(|e| (e.aggregate_type.as_str(), e.aggregate_id.as_str()))
            .collect();
        aggregates.sort_unstable();
        aggregates.dedup();
        let last = sql::last_applied_sequences::<DB>(
            tx,
            self.inbox.table_name(),
            self.name(),
            &aggregates,
        )
        .await?;
        let mut known: HashMap<(&str, &str), Option<u64>> = HashMap::new();
        let mut ready = Vec::with_capacity(envelopes.len());
        for (k, envelope) in envelopes.iter().enumerate() {
            let check = self.order_check(envelope).unwrap_or_default();
            let aggregate = (
                envelope.aggregate_type.as_str(),
                envelope.aggregate_id.as_str(),
            );
            let known = known.entry(aggregate).or_insert_with(|| {
                last.get(&(aggregate.0.to_owned(), aggregate.1.to_owned()))
                    .and_then(|&last| u64::try_from(last).ok())
                    .max(check.settled)
            });
            let sequence = envelope.aggregate_sequence;
            if in_sequence(sequence, *known) || check.accept_gap {
                if !in_sequence(sequence, *known) {
                    gaps.push((k, *known));
                }
                *known = Some(known.map_or(sequence, |known| known.max(sequence)));
                ready.push(k);
            } else {
                processed[k] = Processed::Early {
                    waits_for: known.map_or(1, |last| last + 1),
                };
            }
        }
        Ok(ready)
    }

    /// One transaction over `batch`: the multi-row inbox insert, then each new event's handler.
    async fn try_batch(&self, batch: &[(usize, EventEnvelope)]) -> Result<BatchRun, sqlx::Error> {
        let mut tx = self.inbox.pool().begin().await?;
        let envelopes: Vec<&EventEnvelope> = batch.iter().map(|(_, e)| e).collect();
        let mut processed = vec![Processed::Duplicate; batch.len()];
        let mut gaps = Vec::new();
        let ready: Vec<usize> = if self.order.is_some() {
            self.order_batch(&mut tx, &envelopes, &mut processed, &mut gaps)
                .await?
        } else {
            (0..envelopes.len()).collect()
        };
        let to_insert: Vec<&EventEnvelope> = ready.iter().map(|k| envelopes[*k]).collect();
        let new = if to_insert.is_empty() {
            std::collections::HashSet::new()
        } else {
            sql::insert_consumed_batch::<DB>(
                &mut tx,
                self.inbox.table_name(),
                self.name(),
                &to_insert,
                self.inbox.now(),
            )
            .await?
        };
        let fresh: Vec<usize> = ready
            .into_iter()
            .filter(|k| new.contains(envelopes[*k].event_id.as_str()))
            .collect();
        let mut at = 0;
        while at < fresh.len() {
            let k = fresh[at];
            let envelope = envelopes[k];
            if !self.routes.handles(&envelope.event_type) {
                // Recorded without an effect, for the order guard.
                processed[k] = Processed::Ignored;
                at += 1;
                continue;
            }
            if self.routes.takes_batches(&envelope.event_type) {
                // The run of new events of this type that follow: one call.
                let mut end = at + 1;
                while end < fresh.len() && envelopes[fresh[end]].event_type == envelope.event_type {
                    end += 1;
                }
                let run: Vec<&EventEnvelope> =
                    fresh[at..end].iter().map(|k| envelopes[*k]).collect();
                let span = tracing::info_span!(
                    "event.consume",
                    consumer = self.name(),
                    event_type = %envelope.event_type,
                    events = run.len(),
                );
                let handled = self
                    .routes
                    .dispatch_batch(&mut tx, &run, &self.upcasters)
                    .instrument(span)
                    .await;
                if handled.is_err() {
                    tx.rollback().await?;
                    return Ok(BatchRun::FailedRun(k, fresh[end - 1] + 1));
                }
                for k in &fresh[at..end] {
                    processed[*k] = Processed::Applied;
                }
                at = end;
                continue;
            }
            let span = tracing::info_span!(
                "event.consume",
                consumer = self.name(),
                event_id = %envelope.event_id,
                event_type = %envelope.event_type,
                trace_id = envelope.trace_id.as_deref().unwrap_or(""),
                parent_id = parent_span_id(envelope).unwrap_or(""),
            );
            let handled = self
                .routes
                .dispatch(&mut tx, envelope, &self.upcasters)
                .instrument(span)
                .await;
            if handled.is_err() {
                tx.rollback().await?;
                return Ok(BatchRun::FailedAt(k));
            }
            processed[k] = Processed::Applied;
            at += 1;
        }
        tx.commit().await?;
        let now = self.inbox.now();
        for (envelope, outcome) in envelopes.iter().zip(&processed) {
            match outcome {
                Processed::Early { .. } => self.waiting.early(envelope, now),
                _ => self.waiting.done(envelope),
            }
        }
        for (k, last_applied) in gaps {
            self.report_gap(envelopes[k], last_applied);
        }
        Ok(BatchRun::Committed(processed))
    }

    async fn one_by_one(
        &self,
        batch: &[(usize, EventEnvelope)],
        messages: &[Received<'_>],
        outcomes: &mut [Option<Processed>],
    ) -> Result<(), Error> {
        for (i, _) in batch {
            let message = &messages[*i];
            outcomes[*i] = Some(self.receive(message.body, message.message_id).await?);
        }
        Ok(())
    }

    fn count_batch(
        &self,
        batch: &[(usize, EventEnvelope)],
        processed: &[Processed],
        started: std::time::Instant,
    ) {
        for ((_, envelope), outcome) in batch.iter().zip(processed) {
            let labels = [
                ("consumer", self.name().to_owned()),
                ("event_type", envelope.event_type.clone()),
                ("outcome", outcome.name().to_owned()),
            ];
            ::metrics::counter!(metrics::CONSUMER_EVENTS, &labels).increment(1);
        }
        ::metrics::histogram!(metrics::CONSUMER_BATCH_SIZE, "consumer" => self.name().to_owned())
            .record(batch.len() as f64);
        ::metrics::histogram!(metrics::CONSUMER_BATCH_SECONDS, "consumer" => self.name().to_owned())
            .record(started.elapsed().as_secs_f64());
    }

    /// Processes the quarantined events that `filter` selects again with the consumer's own
    /// handlers (after a fix), however many there are, and marks each one replayed once it is
    /// applied or found already applied. Returns how many were replayed.
    pub async fn replay_quarantined(&self, filter: &QuarantineFilter<'_>) -> Result<usize, Error> {
        self.replay_with(QuarantineStatus::Quarantined, filter, &self.routes)
            .await
    }

    /// Replays, with the consumer's own handlers, the entries an operator requeued
    /// ([`Quarantine::requeue`](crate::Quarantine::requeue), `eventctl quarantine requeue`), and
    /// marks each one replayed, or quarantined again if it still fails. The subscriptions' `run`
    /// loops call it between drains; a custom loop calls it now and then (it is one indexed
    /// query when nothing is requeued). Returns how many were replayed.
    pub async fn replay_requeued(&self) -> Result<usize, Error> {
        let replayed = self
            .replay_with(
                QuarantineStatus::Requeued,
                &QuarantineFilter::default(),
                &self.routes,
            )
            .await?;
        if replayed > 0 {
            ::metrics::counter!(metrics::CONSUMER_REQUEUED_REPLAYED, "consumer" => self.name().to_owned())
                .increment(replayed as u64);
            tracing::info!(
                consumer = self.name(),
                replayed,
                "replayed requeued quarantine entries"
            );
        }
        Ok(replayed)
    }

    /// The event types the handlers take.
    pub fn event_types(&self) -> Vec<&'static str> {
        let mut types = Vec::new();
        self.routes.event_types(&mut types);
        types.reverse();
        types
    }
}

impl<DB: Backend, R: Clone> Clone for Consumer<DB, R> {
    fn clone(&self) -> Self {
        Consumer {
            inbox: self.inbox.clone(),
            version: self.version.clone(),
            upcasters: self.upcasters.clone(),
            retries: self.retries.clone(),
            attempts: self.attempts,
            owner: self.owner.clone(),
            quarantine: self.quarantine.clone(),
            routes: self.routes.clone(),
            unknown: self.unknown,
            order: self.order,
            waiting: std::sync::Arc::clone(&self.waiting),
        }
    }
}

impl<DB: Backend, R> std::fmt::Debug for Consumer<DB, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("name", &self.name())
            .field("version", &self.version)
            .field("unknown_events", &self.unknown)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_consume_span_continues_the_producers_span() {
        let json = r#"{"eventId":"e-1","eventType":"ORDER_PLACED","eventVersion":1,
          "aggregateType":"ORDER","aggregateId":"o-1","aggregateSequence":1,
          "occurredAt":"2026-01-23T10:20:30Z","traceId":"4bf92f3577b34da6a3ce929d0e0e4736",
          "headers":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
          "payload":{}}"#;
        let mut envelope: event_core::EventEnvelope = serde_json::from_str(json).unwrap();
        assert_eq!(super::parent_span_id(&envelope), Some("00f067aa0ba902b7"));
        envelope.headers.traceparent = Some("garbage".into());
        assert_eq!(super::parent_span_id(&envelope), None);
        envelope.headers.traceparent = None;
        assert_eq!(super::parent_span_id(&envelope), None);
    }
}
