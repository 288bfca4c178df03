//! The service's real outbox, relay and consumers over one database and a broker in memory,
//! run until nothing is left to do.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use chrono::{DateTime, Utc};
use event_core::{EventContext, EventEnvelope};
use event_sqlx::{
    Backend, Clock, Consumer, Error, EventStatus, MessageStore, MessageWorker, Outbox,
    OutboxConfig, OutboxMessage, OutboxRecord, OutboxSearch, Processed, Received, Relay,
    RelayConfig, Routes,
};
use sqlx::Pool;

use crate::broker::{Delivery, MemoryBroker};
use crate::clock::TestClock;
use crate::deadline::Deadline;
use crate::expect::{Expected, compare};

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

    /// Runs the relay, the consumers and the workers until nothing is left to do at the
    /// harness's current time: no event pending, leased or due for a retry, no message
    /// undelivered, no handler running, events committed by handlers included.
    ///
    /// Time does not move (see [`Harness::run_for`]): when what is left waits for time (a retry
    /// not yet due, the lease of a crashed relay), for a predecessor that does not come, or the
    /// deadline or the step budget runs out, the error lists it: which rows in which state,
    /// which messages for which consumer, what was running.
    pub async fn settle(&mut self) -> Result<Settled, Unsettled> {
        let deadline = Deadline::start(self.deadline);
        self.settle_until(&deadline, Settled::default()).await
    }

    /// [`Harness::settle`], letting up to `duration` of time pass: whenever what is left waits
    /// for time, the clock jumps to the next moment something is due (a retry, a lease's end)
    /// and the pipeline runs again. A whole backoff schedule or a crashed relay's lease runs out
    /// in milliseconds of real time. It returns once everything settled, the clock at the last
    /// moment something fell due; when what is left falls due after `duration`, the clock
    /// ends `duration` later.
    pub async fn run_for(&mut self, duration: Duration) -> Result<Settled, Unsettled> {
        let end = after(self.clock.now(), duration);
        let deadline = Deadline::start(self.deadline);
        let mut settled = Settled::default();
        loop {
            match self.settle_until(&deadline, settled).await {
                Ok(done) => return Ok(done),
                Err(unsettled) if unsettled.stop == Stop::Idle => {
                    let now = self.clock.now();
                    let next = unsettled
                        .next_due()
                        .map(|at| at.max(after(now, Duration::from_millis(1))));
                    match next {
                        Some(at) if at <= end => {
                            self.clock.advance_to(at);
                            settled = unsettled.progress;
                        }
                        Some(_) => {
                            // Due later than the time given: that time passes, nothing more.
                            self.clock.advance_to(end);
                            return Err(unsettled);
                        }
                        // Nothing falls due by itself: no time needs to pass.
                        None => return Err(unsettled),
                    }
                }
                Err(unsettled) => return Err(unsettled),
            }
        }
    }

    async fn settle_until(
        &mut self,
        deadline: &Deadline,
        mut settled: Settled,
    ) -> Result<Settled, Unsettled> {
        loop {
            let mut progressed = false;
            progressed |= self.relay_round(deadline, &mut settled).await?;
            for i in 0..self.consumers.len() {
                progressed |= self.deliver_round(i, deadline, &mut settled).await?;
            }
            for i in 0..self.workers.len() {
                let worker = &self.workers[i];
                let report = tokio::select! {
                    report = worker.run_once() => report,
                    () = deadline.expired() => {
                        return Err(self.unsettled(Stop::Deadline(self.deadline), Some("the message worker".into()), settled).await);
                    }
                };
                settled.steps += 1;
                match report {
                    Ok(report) => progressed |= report.claimed > 0,
                    Err(e) => {
                        return Err(self
                            .unsettled(
                                Stop::Failed(format!("the message worker failed: {}", chain(&e))),
                                None,
                                settled,
                            )
                            .await);
                    }
                }
            }
            if !progressed {
                let left = self.unsettled(Stop::Idle, None, settled).await;
                if left.is_empty() {
                    return Ok(left.progress);
                }
                return Err(left);
            }
            if settled.steps >= self.step_budget {
                return Err(self
                    .unsettled(Stop::Budget(self.step_budget), None, settled)
                    .await);
            }
        }
    }

    /// Recovers expired leases, then publishes batch after batch while the relay claims some.
    async fn relay_round(
        &mut self,
        deadline: &Deadline,
        settled: &mut Settled,
    ) -> Result<bool, Unsettled> {
        let mut progressed = false;
        match self.relay.recover_expired_leases().await {
            Ok(n) => progressed |= n > 0,
            Err(e) => {
                return Err(self
                    .unsettled(
                        Stop::Failed(format!("lease recovery failed: {}", chain(&e))),
                        None,
                        *settled,
                    )
                    .await);
            }
        }
        loop {
            let outcome = tokio::select! {
                report = self.relay.run_once() => Some(report),
                () = self.broker.relay_crashed() => None,
                () = deadline.expired() => {
                    let running = format!("relay {} publishing a batch", self.relay.config().instance_id());
                    return Err(self.unsettled(Stop::Deadline(self.deadline), Some(running), *settled).await);
                }
            };
            settled.steps += 1;
            match outcome {
                None => {
                    // The relay died between the broker's ack and its mark.
                    settled.relay_crashes += 1;
                    self.generation += 1;
                    self.relay = self.new_relay();
                    progressed = true;
                }
                Some(Ok(report)) => {
                    if report.claimed == 0 {
                        return Ok(progressed);
                    }
                    settled.published += report.published;
                    progressed = true;
                }
                Some(Err(Error::BrokerUnavailable { .. })) => {
                    // Given back unpublished; the fault is spent, the next claim goes on.
                    progressed = true;
                }
                Some(Err(e)) => {
                    return Err(self
                        .unsettled(
                            Stop::Failed(format!("the relay failed: {}", chain(&e))),
                            None,
                            *settled,
                        )
                        .await);
                }
            }
            if settled.steps >= self.step_budget {
                return Err(self
                    .unsettled(Stop::Budget(self.step_budget), None, *settled)
                    .await);
            }
        }
    }

    /// Delivers one batch of consumer `i`'s queue. Early events go back to the end of the
    /// queue; on an error the batch goes back unacknowledged.
    async fn deliver_round(
        &mut self,
        i: usize,
        deadline: &Deadline,
        settled: &mut Settled,
    ) -> Result<bool, Unsettled> {
        let queue = self.consumers[i].queue;
        let mut batch = self.broker.take(queue, self.batch);
        if batch.is_empty() {
            return Ok(false);
        }
        let stop_after = self.consumers[i].stop_after.take();
        let processed_part = stop_after.map_or(batch.len(), |k| k.min(batch.len()));
        let outcome = {
            let subscribed = &self.consumers[i];
            let received: Vec<Received<'_>> = batch[..processed_part]
                .iter()
                .map(|d| Received {
                    body: &d.body,
                    message_id: Some(&d.message.message_id),
                })
                .collect();
            tokio::select! {
                outcome = subscribed.consumer.receive(&received) => Some(outcome),
                () = deadline.expired() => None,
            }
        };
        settled.steps += 1;
        let name = self.consumers[i].consumer.name().to_owned();
        let outcomes = match outcome {
            None => {
                let ids: Vec<String> = batch
                    .iter()
                    .map(|d| d.message.envelope.event_id.to_string())
                    .collect();
                self.broker.give_back(queue, batch, true);
                let running = format!("consumer {name} handling {}", ids.join(", "));
                return Err(self
                    .unsettled(Stop::Deadline(self.deadline), Some(running), *settled)
                    .await);
            }
            Some(Err(e)) => {
                self.broker.give_back(queue, batch, true);
                return Err(self
                    .unsettled(
                        Stop::Failed(format!("consumer {name} stopped: {}", chain(&e))),
                        None,
                        *settled,
                    )
                    .await);
            }
            Some(Ok(outcomes)) => outcomes,
        };
        let mut progressed = false;
        let mut early: Vec<Delivery> = Vec::new();
        let subscribed = &mut self.consumers[i];
        for (delivery, processed) in batch[..processed_part].iter().zip(outcomes) {
            if let Processed::Early { .. } = processed {
                if stop_after.is_none() {
                    early.push(delivery.clone());
                }
                subscribed
                    .received
                    .push((delivery.message.envelope.clone(), processed));
                continue;
            }
            progressed = true;
            settled.delivered += 1;
            subscribed
                .received
                .push((delivery.message.envelope.clone(), processed));
        }
        if stop_after.is_some() {
            // Stopped before acknowledging: the whole batch is delivered again.
            settled.consumer_stops += 1;
            self.broker
                .give_back(queue, std::mem::take(&mut batch), true);
            return Ok(true);
        }
        self.broker.give_back(queue, early, false);
        Ok(progressed)
    }

    /// What is left: outbox rows not yet published, messages not yet delivered.
    async fn unsettled(&self, stop: Stop, running: Option<String>, progress: Settled) -> Unsettled {
        let mut rows = Vec::new();
        let mut problems = Vec::new();
        for status in [
            EventStatus::Pending,
            EventStatus::InProgress,
            EventStatus::Failed,
        ] {
            match self
                .outbox
                .search(&OutboxSearch::default().status(status), 100)
                .await
            {
                Ok(found) => rows.extend(found.into_iter().filter(|r| {
                    r.publish_status != EventStatus::Failed || r.retry_count < r.max_retry_count
                })),
                Err(e) => problems.push(format!("could not read the outbox: {}", chain(&e))),
            }
        }
        rows.sort_by_key(|r| r.id);
        let mut undelivered = Vec::new();
        for subscribed in &self.consumers {
            for delivery in self.broker.queued(subscribed.queue) {
                let waits_for = subscribed
                    .received
                    .iter()
                    .rev()
                    .find(|(e, _)| e.event_id == delivery.message.envelope.event_id)
                    .and_then(|(_, p)| match p {
                        Processed::Early { waits_for } => Some(*waits_for),
                        _ => None,
                    });
                undelivered.push(Undelivered {
                    consumer: subscribed.consumer.name().to_owned(),
                    envelope: delivery.message.envelope,
                    waits_for,
                });
            }
        }
        Unsettled {
            stop,
            now: self.clock.now(),
            rows,
            undelivered,
            running,
            problems,
            progress,
        }
    }
}

fn after(at: DateTime<Utc>, by: Duration) -> DateTime<Utc> {
    chrono::TimeDelta::from_std(by)
        .ok()
        .and_then(|by| at.checked_add_signed(by))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// What [`Harness::settle`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Settled {
    /// Steps taken: relay batches, consumer batches, worker rounds.
    pub steps: usize,
    /// Events the relay published and marked.
    pub published: usize,
    /// Messages consumers acknowledged (applied, duplicate, ignored, stale, quarantined).
    pub delivered: usize,
    /// Relays that crashed between publish and mark
    /// ([`MemoryBroker::crash_relay_after_next_publish`]).
    pub relay_crashes: usize,
    /// Consumers stopped mid-batch ([`Harness::stop_consumer_mid_batch`]).
    pub consumer_stops: usize,
}

/// Why [`Harness::settle`] stopped before everything settled.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stop {
    /// Nothing more happens at the current time: what is left waits for time to pass, or for
    /// an event that does not come.
    Idle,
    /// The deadline (real time) passed.
    Deadline(Duration),
    /// The step budget ran out.
    Budget(usize),
    /// The relay, a consumer or the worker failed (a consumer's bug, a database error).
    Failed(String),
}

/// A message the broker holds for a consumer.
#[derive(Debug, Clone, PartialEq)]
pub struct Undelivered {
    /// The consumer.
    pub consumer: String,
    /// The message's envelope.
    pub envelope: EventEnvelope,
    /// The sequence it waits for, when the consumer's order guard gave it back.
    pub waits_for: Option<u64>,
}

/// What was left when [`Harness::settle`] stopped, and why.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Unsettled {
    /// Why it stopped.
    pub stop: Stop,
    /// The harness's time then.
    pub now: DateTime<Utc>,
    /// Outbox rows not yet published: pending, leased, or failed with retries left (at most 100
    /// of each status).
    pub rows: Vec<OutboxRecord>,
    /// Messages not yet delivered.
    pub undelivered: Vec<Undelivered>,
    /// What was running when the deadline passed.
    pub running: Option<String>,
    /// What could not be read about the rest.
    pub problems: Vec<String>,
    /// What was done before it stopped.
    pub progress: Settled,
}

impl Unsettled {
    fn is_empty(&self) -> bool {
        self.rows.is_empty() && self.undelivered.is_empty() && self.problems.is_empty()
    }

    /// The next moment something left falls due: a retry, a lease's end; a second from now
    /// for an event given back to wait for its predecessor.
    pub fn next_due(&self) -> Option<DateTime<Utc>> {
        let rows = self.rows.iter().filter_map(|r| match r.publish_status {
            EventStatus::Failed => r.next_retry_time,
            EventStatus::InProgress => r.lock_until,
            _ => None,
        });
        let waiting = self
            .undelivered
            .iter()
            .any(|u| u.waits_for.is_some())
            .then(|| after(self.now, Duration::from_secs(1)));
        rows.chain(waiting).min()
    }
}

impl fmt::Display for Unsettled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = |t: DateTime<Utc>| {
            let secs = (t - self.now).num_milliseconds() as f64 / 1000.0;
            format!("{} ({secs:+} s)", t.format("%H:%M:%S%.3f"))
        };
        match &self.stop {
            Stop::Idle => writeln!(
                f,
                "the pipeline did not settle: nothing more happens at the harness's time {}",
                self.now.format("%H:%M:%S%.3f")
            )?,
            Stop::Deadline(d) => writeln!(
                f,
                "the pipeline did not settle within its deadline of {d:?} (Harness::deadline)"
            )?,
            Stop::Budget(n) => writeln!(
                f,
                "the pipeline did not settle within its step budget of {n} steps (Harness::step_budget): do handlers cause events without end?"
            )?,
            Stop::Failed(why) => writeln!(f, "the pipeline did not settle: {why}")?,
        }
        if let Some(running) = &self.running {
            writeln!(f, "running when it stopped: {running}")?;
        }
        if !self.rows.is_empty() {
            writeln!(f, "outbox rows not published ({}):", self.rows.len())?;
            for r in &self.rows {
                let state = match r.publish_status {
                    EventStatus::Pending => "pending".to_owned(),
                    EventStatus::InProgress => format!(
                        "in progress, leased by {} until {}",
                        r.locked_by.as_deref().unwrap_or("?"),
                        r.lock_until.map_or_else(|| "?".to_owned(), at)
                    ),
                    EventStatus::Failed => format!(
                        "failed {} of {} times, next retry {}",
                        r.retry_count,
                        r.max_retry_count,
                        r.next_retry_time.map_or_else(|| "?".to_owned(), at)
                    ),
                    other => other.name().to_owned(),
                };
                write!(
                    f,
                    "  #{} {} ({} {} #{}): {state}",
                    r.id, r.event_no, r.aggregate_type, r.aggregate_id, r.aggregate_sequence
                )?;
                if let Some(reason) = &r.fail_reason {
                    write!(f, "; last failure: {reason}")?;
                }
                writeln!(f)?;
            }
        }
        if !self.undelivered.is_empty() {
            writeln!(f, "messages not delivered ({}):", self.undelivered.len())?;
            for u in &self.undelivered {
                write!(
                    f,
                    "  to {}: {} ({} {} #{})",
                    u.consumer,
                    u.envelope.event_id,
                    u.envelope.aggregate_type,
                    u.envelope.aggregate_id,
                    u.envelope.aggregate_sequence
                )?;
                if let Some(w) = u.waits_for {
                    write!(f, ", given back to wait for sequence {w}")?;
                }
                writeln!(f)?;
            }
        }
        for problem in &self.problems {
            writeln!(f, "{problem}")?;
        }
        if self.stop == Stop::Idle {
            match self.next_due() {
                Some(due) => write!(
                    f,
                    "the next is due at {}: advance the clock (Harness::advance) or let time pass (Harness::run_for)",
                    at(due)
                )?,
                None => write!(f, "nothing left falls due by itself")?,
            }
        }
        Ok(())
    }
}

impl std::error::Error for Unsettled {}
