//! Consumers (seed 003): every event applied once in effect through the inbox, failures sorted
//! into transient (retried with backoff), permanent (quarantined with what is needed to recover)
//! and bugs (the consumer stops and says why), and quarantined events replayed after a fix.

use event_core::{EventEnvelope, Upcasters};
use sqlx::Pool;

use crate::clock::Clock;
use crate::config::backoff::Backoff;
use crate::error::{Error, HandlerError};
use crate::inbox::Inbox;
use crate::route::{BoxRoutes, Delivered, NoRoutes, On, OnBatch, SendRoutes, UnknownEvents};
use crate::sql::dialect::Backend;
use crate::table::TableName;

mod batch;
mod process;
mod quarantine;

/// A [`Consumer`] with its handlers boxed: a type to name in a field or a return type, and to
/// spawn. Built with [`Consumer::boxed`].
pub type BoxConsumer<DB> = Consumer<DB, BoxRoutes<DB>>;

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
    messaging_spans: bool,
    lanes: usize,
}

/// The most transactions [`Consumer::concurrency`] runs at once.
const MAX_LANES: usize = 64;

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
            messaging_spans: false,
            lanes: 1,
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
    /// The consumer's type names every handler. To store it in a field, return it from a
    /// function or spawn it from there, box the handlers with [`Consumer::boxed`].
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

    /// The same consumer with its handlers boxed: a [`BoxConsumer<DB>`], a type that a field,
    /// a function's return type or a `tokio::spawn`ed task can hold. Each handler must be an
    /// `async fn` (or an async closure that captures nothing) whose future is `Send`
    /// ([`SendHandler`](crate::SendHandler)); a dispatch then costs one allocation.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] mod demo {
    /// use event_sqlx::{BoxConsumer, Consumer, Delivered, HandlerError};
    /// use sqlx::{Sqlite, SqliteConnection, SqlitePool};
    ///
    /// #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, event_core::DomainEvent)]
    /// struct OrderPaid {
    ///     order_id: String,
    /// }
    ///
    /// async fn on_paid(conn: &mut SqliteConnection, paid: Delivered<OrderPaid>) -> Result<(), HandlerError> {
    ///     sqlx::query("INSERT INTO invoice (order_id) VALUES (?)")
    ///         .bind(&paid.order_id)
    ///         .execute(conn)
    ///         .await?;
    ///     Ok(())
    /// }
    ///
    /// struct Billing {
    ///     consumer: BoxConsumer<Sqlite>,
    /// }
    ///
    /// fn billing(pool: SqlitePool) -> BoxConsumer<Sqlite> {
    ///     Consumer::new(pool, "billing", "1.0.0").on(on_paid).boxed()
    /// }
    ///
    /// # async fn demo(pool: SqlitePool) {
    /// let service = Billing { consumer: billing(pool) };
    /// let consumer = service.consumer.clone();
    /// tokio::spawn(async move { consumer.replay_requeued().await });
    /// # }
    /// # }
    /// ```
    pub fn boxed(self) -> BoxConsumer<DB>
    where
        R: SendRoutes<DB>,
    {
        self.map_routes(BoxRoutes::new)
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
            messaging_spans: self.messaging_spans,
            lanes: self.lanes,
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

    /// Opens an OpenTelemetry messaging span, `process {destination}`, for each event a
    /// subscription processes, in the trace of the event's `traceparent` and linked to it (off
    /// by default; see [`crate::telemetry`]).
    pub fn messaging_spans(self, on: bool) -> Self {
        Self {
            messaging_spans: on,
            ..self
        }
    }

    /// Applies a batch in up to `lanes` transactions at once, on as many connections, instead of
    /// one (the default): each aggregate's events of the batch go to one lane, in their order,
    /// and the subscription takes its next batch once every lane has committed, so the order of
    /// each aggregate's events holds as with one transaction. Raise it when the handlers' own
    /// round trips (one statement per event with [`Consumer::on`]) set the pace rather than the
    /// database's cores; keep the pool at least this large, or the lanes wait for connections.
    /// It applies to batches ([`Consumer::receive_batch`], a subscription's `.batch(n)` with
    /// `n` > 1) on PostgreSQL; events that arrive one at a time are applied one at a time. On
    /// MySQL and SQLite every batch is applied in one transaction: there the lanes would wait
    /// for each other (SQLite has one writer; a MySQL batch locks the inbox's gaps where the
    /// other lanes insert), and setting more than 1 there logs a warning.
    ///
    /// A lane that fails is handled as a batch that fails (see [`Consumer::receive_batch`]);
    /// the others commit. From 1 to 64: a value out of range is clamped, with a warning.
    pub fn concurrency(mut self, lanes: usize) -> Self {
        let clamped = lanes.clamp(1, MAX_LANES);
        if clamped != lanes {
            tracing::warn!(
                consumer = self.name(),
                asked = lanes,
                used = clamped,
                "consumer concurrency out of range (1 to {MAX_LANES}); using {clamped}"
            );
        }
        // Lanes run where the database takes them (SQLite has one writer; MySQL's lanes would
        // wait for each other); connections are kept for those alone.
        let running = if DB::DIALECT.concurrent_inbox_batches() {
            clamped
        } else {
            1
        };
        if running < clamped {
            tracing::warn!(
                consumer = self.name(),
                lanes = clamped,
                "consumer concurrency applies on PostgreSQL only; this database applies each \
                 batch in one transaction"
            );
        }
        self.lanes = running;
        self.inbox = self.inbox.keep_up_to(running);
        self
    }

    /// Whether [`Consumer::messaging_spans`] is on.
    pub(crate) fn has_messaging_spans(&self) -> bool {
        self.messaging_spans
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

    /// Keeps the consumer's connection from one transaction to the next while the returned
    /// guard lives: a subscription holds it while messages keep coming and drops it before it
    /// waits for more (see `Inbox::hold`).
    #[cfg_attr(
        not(any(feature = "nats", feature = "rabbitmq", feature = "kafka")),
        allow(dead_code) // the subscriptions hold it
    )]
    pub(crate) fn hold_connection(&self) -> crate::inbox::Holding<DB> {
        self.inbox.hold()
    }

    async fn conn(&self) -> Result<sqlx::pool::PoolConnection<DB>, Error> {
        self.inbox
            .pool()
            .acquire()
            .await
            .map_err(|e| Error::database(&self.quarantine, e))
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
    use std::fmt::Write;

    use sha2::{Digest, Sha256};

    /// A stable name for a body that is not an envelope: `body:` and the first 128 bits of its
    /// SHA-256, in hex (37 characters, within the quarantine's 64 for an event id). A body
    /// comes from whoever can publish to the broker, so two bodies must not be made to share
    /// a name: the second would overwrite the first one's quarantine entry.
    pub(super) fn digest(body: &[u8]) -> String {
        let hash = Sha256::digest(body);
        let mut name = String::with_capacity(37);
        name.push_str("body:");
        for byte in &hash[..16] {
            let _ = write!(name, "{byte:02x}");
        }
        name
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn a_body_is_named_by_its_sha256() {
            // printf '%s' 'not an envelope' | sha256sum
            assert_eq!(
                super::digest(b"not an envelope"),
                "body:6361b2dd9a13e547309db738ba0215b0"
            );
            assert_ne!(super::digest(b"{}"), super::digest(b"{} "));
            assert!(super::digest(&[0xff; 100_000]).len() <= 64);
        }
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
            messaging_spans: self.messaging_spans,
            lanes: self.lanes,
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
