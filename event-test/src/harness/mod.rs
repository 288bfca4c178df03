//! The service's real outbox, relay and consumers over one database and a broker in memory,
//! run until nothing is left to do.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use event_core::{EventContext, EventEnvelope};
use event_sqlx::{
    Backend, Clock, Consumer, Error, MessageStore, MessageWorker, Outbox, OutboxConfig,
    OutboxMessage, Processed, Received, Relay, RelayConfig, Routes,
};
use sqlx::Pool;

use crate::broker::MemoryBroker;
use crate::clock::TestClock;
use crate::expect::{Expected, compare};

mod report;
mod settle;

pub use report::{Settled, Stop, Undelivered, Unsettled};

/// A consumer as the harness keeps it, whatever its handlers' types.
trait Subscriber<DB: Backend> {
    fn name(&self) -> &str;
    fn receive<'a>(
        &'a self,
        messages: &'a [Received<'a>],
    ) -> Pin<Box<dyn Future<Output = Result<Vec<Processed>, Error>> + 'a>>;
}

impl<DB: Backend, R: Routes<DB>> Subscriber<DB> for Consumer<DB, R> {
    fn name(&self) -> &str {
        Consumer::name(self)
    }

    fn receive<'a>(
        &'a self,
        messages: &'a [Received<'a>],
    ) -> Pin<Box<dyn Future<Output = Result<Vec<Processed>, Error>> + 'a>> {
        Box::pin(self.receive_batch(messages))
    }
}

struct Subscribed<DB: Backend> {
    consumer: Box<dyn Subscriber<DB>>,
    queue: usize,
    received: Vec<(EventEnvelope, Processed)>,
    /// Set by [`Harness::stop_consumer_mid_batch`]: after this many messages of its next
    /// batch, the consumer stops before acknowledging any.
    stop_after: Option<usize>,
}

/// The service's real [`Outbox`], [`Relay`] and [`Consumer`]s, a [`MessageWorker`] if it has
/// one, over one database (SQLite in memory by default, or a pool the test gives) and a
/// [`MemoryBroker`], moved by one [`TestClock`].
///
/// Nothing of the toolkit is replaced: the relay claims under its lease and marks what the
/// broker accepted, each consumer records every event in its inbox in the transaction of its
/// handler, as in production. The broker delivers every message it accepts to every consumer,
/// in batches, as the subscriptions do ([`Consumer::receive_batch`]).
///
/// [`Harness::settle`] runs them all until nothing is pending, leased or undelivered, events
/// that handlers commit included, and says what is left when that cannot happen;
/// [`Harness::advance`] moves time for all of them, [`Harness::run_for`] lets time pass to
/// whatever is due next. Each harness has its own database (in memory) and broker: tests do not
/// see each other's events.
///
/// ```
/// # #[derive(Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema, event_core::DomainEvent)]
/// # #[domain_event(aggregate = "ORDER")]
/// # struct OrderPlaced { #[domain_event(aggregate_id)] order_id: String }
/// use event_sqlx::{Consumer, Delivered};
/// use event_test::{Expected, Harness};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut h = Harness::new().await?;
/// sqlx::query("CREATE TABLE bill (order_id TEXT PRIMARY KEY)").execute(h.pool()).await?;
/// h.consumer(Consumer::new(h.pool().clone(), "billing", "1").on(
///     async |tx: &mut sqlx::SqliteConnection, placed: Delivered<OrderPlaced>| {
///         sqlx::query("INSERT INTO bill (order_id) VALUES (?)")
///             .bind(&placed.order_id)
///             .execute(&mut *tx)
///             .await?;
///         Ok(())
///     },
/// ));
///
/// // What the service does on a command: state and events in one transaction.
/// let envelopes = vec![event_test::envelope(OrderPlaced { order_id: "o-1".into() }).build()];
/// let mut tx = h.pool().begin().await?;
/// h.outbox().flush(&mut tx, &envelopes).await?;
/// tx.commit().await?;
///
/// h.settle().await?;
/// h.assert_applied("billing", [Expected::like::<OrderPlaced>(serde_json::json!({ "order_id": "o-1" }))]);
/// # Ok(()) }
/// ```
pub struct Harness<DB: Backend> {
    outbox: Outbox<DB>,
    clock: TestClock,
    broker: MemoryBroker,
    relay_config: Box<dyn Fn(RelayConfig) -> RelayConfig>,
    relay: Relay<DB, MemoryBroker>,
    generation: u32,
    consumers: Vec<Subscribed<DB>>,
    workers: Vec<MessageWorker<DB>>,
    deadline: Duration,
    step_budget: usize,
    batch: usize,
}

#[cfg(feature = "sqlite")]
impl Harness<sqlx::Sqlite> {
    /// A harness over a fresh SQLite database in memory ([`memory_database`]), with the
    /// default outbox settings.
    ///
    /// [`memory_database`]: crate::memory_database
    pub async fn new() -> Result<Harness<sqlx::Sqlite>, Error> {
        let pool = crate::db::memory_database().await?;
        Harness::with_pool(pool, OutboxConfig::new()).await
    }
}

impl<DB: Backend> Harness<DB> {
    /// A harness over `pool` (migrated here) with the outbox settings `config`, whose clock the
    /// harness replaces with its own. Give it a database of its own (a fresh one per test, as
    /// `#[sqlx::test]` does): harnesses that share tables see each other's events.
    ///
    /// Fails under tokio's paused time (`start_paused`), which fires sqlx's own timeouts: the
    /// harness moves time with its own clock.
    pub async fn with_pool(pool: Pool<DB>, config: OutboxConfig) -> Result<Harness<DB>, Error> {
        let clock = TestClock::new();
        let outbox = Outbox::new(pool, config).with_clock(clock.clone());
        let paused = crate::db::PausedTime::probe();
        let migrated = outbox.migrate().await;
        paused.check()?;
        migrated?;
        let broker = MemoryBroker::new();
        let relay = outbox.relay(broker.clone(), RelayConfig::new("test-relay-1"));
        Ok(Harness {
            outbox,
            clock,
            broker,
            relay_config: Box::new(|config| config),
            relay,
            generation: 1,
            consumers: Vec::new(),
            workers: Vec::new(),
            deadline: Duration::from_secs(30),
            step_budget: 100_000,
            batch: 100,
        })
    }

    /// Configures the relay as the service does (batch size, backoff, lease, ordering...): `f`
    /// gets `RelayConfig::new(id)` and returns the settings, for the relay now and each one
    /// that replaces a crashed relay.
    pub fn relay_config(&mut self, f: impl Fn(RelayConfig) -> RelayConfig + 'static) -> &mut Self {
        self.relay_config = Box::new(f);
        self.relay = self.new_relay();
        self
    }

    fn new_relay(&self) -> Relay<DB, MemoryBroker> {
        let id = format!("test-relay-{}", self.generation);
        self.outbox.relay(
            self.broker.clone(),
            (self.relay_config)(RelayConfig::new(id)),
        )
    }

    /// Adds a consumer, built by the service on [`Harness::pool`]: it gets every message the
    /// broker accepts from now on, and reads the harness's clock. The harness keeps it, so its
    /// handlers own what they use (move a clone of an `Arc` into them rather than borrow).
    ///
    /// # Panics
    /// If a consumer of the same name was added: the two would share one inbox.
    #[track_caller]
    pub fn consumer<R: Routes<DB> + 'static>(&mut self, consumer: Consumer<DB, R>) -> &mut Self {
        assert!(
            self.consumers
                .iter()
                .all(|c| c.consumer.name() != consumer.name()),
            "a consumer named {} was already added: consumers of one name share one inbox; give each its own name",
            consumer.name()
        );
        let queue = self.broker.subscribe();
        self.consumers.push(Subscribed {
            consumer: Box::new(consumer.clock(self.clock.clone())),
            queue,
            received: Vec::new(),
            stop_after: None,
        });
        self
    }

    /// Adds a message worker, built by the service on [`Harness::message_store`].
    pub fn worker(&mut self, worker: MessageWorker<DB>) -> &mut Self {
        self.workers.push(worker);
        self
    }

    /// The message store on the harness's database and clock, for a [`MessageWorker`].
    pub fn message_store(&self) -> MessageStore<DB> {
        MessageStore::new(self.pool().clone()).clock(self.clock.clone())
    }

    /// Messages delivered to a consumer per batch (100 by default): a consumer's `.on_batch`
    /// handlers get up to this many events at once.
    pub fn delivery_batch(&mut self, n: usize) -> &mut Self {
        self.batch = n.max(1);
        self
    }

    /// How long [`Harness::settle`] may take, in real time (30 s by default): a handler that
    /// does not return, or a database that does not answer, fails it then.
    pub fn deadline(&mut self, deadline: Duration) -> &mut Self {
        self.deadline = deadline;
        self
    }

    /// How many steps (a relay batch, a consumer's batch, a worker's round) [`Harness::settle`]
    /// may take (100,000 by default): handlers that commit events which cause events forever
    /// fail it then.
    pub fn step_budget(&mut self, steps: usize) -> &mut Self {
        self.step_budget = steps.max(1);
        self
    }

    /// The database.
    pub fn pool(&self) -> &Pool<DB> {
        self.outbox.pool()
    }

    /// The outbox, on the harness's clock: give it (or a clone) to the service's repositories.
    pub fn outbox(&self) -> &Outbox<DB> {
        &self.outbox
    }

    /// The clock every part reads.
    pub fn clock(&self) -> &TestClock {
        &self.clock
    }

    /// The broker, for faults and for what was published.
    pub fn broker(&self) -> &MemoryBroker {
        &self.broker
    }

    /// The relay running now (a new one after a crash).
    pub fn relay(&self) -> &Relay<DB, MemoryBroker> {
        &self.relay
    }

    /// An event context from `source` stamped with the harness's time, for the service's units
    /// of work.
    pub fn context(&self, source: impl Into<String>) -> EventContext {
        EventContext::new(source).occurred_at(self.clock.now())
    }

    /// Moves the clock of the outbox, the relay, the consumers and the message worker by `by`:
    /// retries fall due, leases expire, events age for retention. Nothing runs until the next
    /// [`Harness::settle`].
    pub fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    /// Makes the consumer `name` stop in its next batch after `after` messages were processed,
    /// before acknowledging any, as a consumer process killed mid-batch: the broker delivers the
    /// whole batch again, and the consumer finds the first `after` already applied.
    #[track_caller]
    pub fn stop_consumer_mid_batch(&mut self, name: &str, after: usize) -> &mut Self {
        let i = self.consumer_index(name);
        self.consumers[i].stop_after = Some(after);
        self
    }

    /// Every message the broker accepted, in order (republishes and duplicates included).
    pub fn published(&self) -> Vec<OutboxMessage> {
        self.broker.published()
    }

    /// Asserts the envelopes the broker accepted, in order and in number.
    #[track_caller]
    pub fn assert_published(&self, expected: impl IntoIterator<Item = Expected>) {
        let expected: Vec<Expected> = expected.into_iter().collect();
        let actual: Vec<EventEnvelope> = self
            .broker
            .published()
            .into_iter()
            .map(|m| m.envelope)
            .collect();
        if let Some(report) = compare(&expected, &actual) {
            panic!("the broker accepted other events than expected: {report}");
        }
    }

    /// Every event delivered to the consumer `name`, with what it did, in order.
    #[track_caller]
    pub fn received(&self, name: &str) -> &[(EventEnvelope, Processed)] {
        &self.consumers[self.consumer_index(name)].received
    }

    /// The events the consumer `name` applied (its handler ran and committed), in order.
    #[track_caller]
    pub fn applied(&self, name: &str) -> Vec<EventEnvelope> {
        self.received(name)
            .iter()
            .filter(|(_, p)| *p == Processed::Applied)
            .map(|(e, _)| e.clone())
            .collect()
    }

    /// Asserts the events the consumer `name` applied, in order and in number.
    #[track_caller]
    pub fn assert_applied(&self, name: &str, expected: impl IntoIterator<Item = Expected>) {
        let expected: Vec<Expected> = expected.into_iter().collect();
        if let Some(report) = compare(&expected, &self.applied(name)) {
            panic!("consumer {name} applied other events than expected: {report}");
        }
    }

    #[track_caller]
    fn consumer_index(&self, name: &str) -> usize {
        match self
            .consumers
            .iter()
            .position(|c| c.consumer.name() == name)
        {
            Some(i) => i,
            None => panic!(
                "no consumer named {name} in the harness; it has: {}",
                self.consumers
                    .iter()
                    .map(|c| c.consumer.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}
