//! One consumer, one envelope at a time: what it did, and what it does the second time.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use event_core::EventEnvelope;
use event_sqlx::{
    Backend, Consumer, Delivered, Error, FailureClass, HandlerError, Processed, QuarantineFilter,
    QuarantineStatus, Routes,
};

/// What delivering an envelope to a consumer did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// Its handler ran and committed.
    Applied,
    /// Consumed before: its handler did not run.
    Duplicate,
    /// Not an event this consumer handles.
    Ignored,
    /// Older than an event applied for its aggregate, and quarantined as stale
    /// (`reject_stale`).
    Stale,
    /// Given back: it waits for the previous sequence of its aggregate (`in_order`).
    Early {
        /// The sequence it waits for.
        waits_for: u64,
    },
    /// In the quarantine, with its class and reason.
    Quarantined {
        /// Permanent, transient (still failing after its retries) or stale.
        class: FailureClass,
        /// The reason recorded.
        reason: String,
    },
}

/// Deliveries of one envelope to the service's own [`Consumer`], as a subscription makes them:
/// its JSON body, through [`Consumer::receive`].
///
/// ```
/// # #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, event_core::DomainEvent)]
/// # #[domain_event(aggregate = "ORDER")]
/// # struct OrderPaid { #[domain_event(aggregate_id)] order_id: String, amount_minor: i64 }
/// use event_sqlx::{Consumer, Delivered};
/// use event_test::{ConsumerTest, Outcome};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = event_test::memory_database().await?;
/// sqlx::query("CREATE TABLE paid (order_id TEXT, amount INTEGER)").execute(&pool).await?;
/// let consumer = Consumer::new(pool.clone(), "billing", "1").on(
///     async |tx: &mut sqlx::SqliteConnection, paid: Delivered<OrderPaid>| {
///         sqlx::query("INSERT INTO paid VALUES (?, ?)")
///             .bind(&paid.order_id).bind(paid.amount_minor)
///             .execute(&mut *tx).await?;
///         Ok(())
///     },
/// );
///
/// let paid = event_test::envelope(OrderPaid { order_id: "o-1".into(), amount_minor: 1999 }).build();
/// let (first, second) = consumer.deliver_twice(&paid).await?;
/// assert_eq!((first, second), (Outcome::Applied, Outcome::Duplicate));
/// let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM paid").fetch_one(&pool).await?;
/// assert_eq!(rows, 1); // one effect
/// # Ok(()) }
/// ```
#[allow(async_fn_in_trait)] // tests await these in place; nothing spawns them
pub trait ConsumerTest {
    /// Delivers `envelope` once and says what the consumer did. `Err` is what a subscription
    /// would stop on: a handler's bug, or a database down past the retries.
    async fn deliver(&self, envelope: &EventEnvelope) -> Result<Outcome, Error>;

    /// Delivers a message body as it came off a broker (not necessarily an envelope).
    async fn deliver_body(&self, body: &[u8]) -> Result<Outcome, Error>;

    /// Delivers `envelope` twice, as a broker redelivering after a lost acknowledgement does.
    async fn deliver_twice(&self, envelope: &EventEnvelope) -> Result<(Outcome, Outcome), Error> {
        let first = self.deliver(envelope).await?;
        let second = self.deliver(envelope).await?;
        Ok((first, second))
    }

    /// Delivers `envelopes` as one batch (as a subscription's `.batch(n)` does), so that
    /// `.on_batch` handlers get them together; one outcome each, in order.
    async fn deliver_batch(&self, envelopes: &[EventEnvelope]) -> Result<Vec<Outcome>, Error>;
}

impl<DB: Backend, R: Routes<DB>> ConsumerTest for Consumer<DB, R> {
    async fn deliver(&self, envelope: &EventEnvelope) -> Result<Outcome, Error> {
        let body = body(envelope);
        self.deliver_body(&body).await
    }

    async fn deliver_body(&self, body: &[u8]) -> Result<Outcome, Error> {
        let processed = self.receive(body, None).await?;
        let id = serde_json::from_slice::<EventEnvelope>(body)
            .map(|e| e.event_id.to_string())
            .ok();
        outcome(self, processed, id.as_deref()).await
    }

    async fn deliver_batch(&self, envelopes: &[EventEnvelope]) -> Result<Vec<Outcome>, Error> {
        let bodies: Vec<Vec<u8>> = envelopes.iter().map(body).collect();
        let received: Vec<event_sqlx::Received<'_>> = bodies
            .iter()
            .map(|b| event_sqlx::Received {
                body: b,
                message_id: None,
            })
            .collect();
        let processed = self.receive_batch(&received).await?;
        let mut outcomes = Vec::with_capacity(processed.len());
        for (p, e) in processed.into_iter().zip(envelopes) {
            outcomes.push(outcome(self, p, Some(e.event_id.as_str())).await?);
        }
        Ok(outcomes)
    }
}

fn body(envelope: &EventEnvelope) -> Vec<u8> {
    // An envelope always serializes: its payload is already JSON.
    serde_json::to_vec(envelope).unwrap_or_default()
}

async fn outcome<DB: Backend, R>(
    consumer: &Consumer<DB, R>,
    processed: Processed,
    event_id: Option<&str>,
) -> Result<Outcome, Error> {
    Ok(match processed {
        Processed::Applied => Outcome::Applied,
        Processed::Duplicate => Outcome::Duplicate,
        Processed::Ignored => Outcome::Ignored,
        Processed::Stale => Outcome::Stale,
        Processed::Early { waits_for } => Outcome::Early { waits_for },
        Processed::Quarantined(reason) => {
            // The event's own entry, by its id: one indexed query. A body that is not an
            // envelope has no event id, and is quarantined as permanent.
            let class = match event_id {
                Some(id) => consumer
                    .quarantine_entries(
                        QuarantineStatus::Quarantined,
                        &QuarantineFilter::default().event_id(id),
                        100,
                    )
                    .await?
                    .last()
                    .map_or(FailureClass::Permanent, |q| q.failure_class),
                None => FailureClass::Permanent,
            };
            Outcome::Quarantined { class, reason }
        }
    })
}

/// Makes a handler fail its first calls, then run: for testing what retries, quarantine and
/// replay do with a handler that fails.
///
/// Clones share the count.
///
/// ```
/// # #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, event_core::DomainEvent)]
/// # struct OrderPaid { order_id: String }
/// use event_sqlx::{Consumer, Delivered, HandlerError};
/// use event_test::{ConsumerTest, Flaky, Outcome};
///
/// async fn on_paid(_tx: &mut sqlx::SqliteConnection, _paid: Delivered<OrderPaid>) -> Result<(), HandlerError> {
///     Ok(())
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = event_test::memory_database().await?;
/// let flaky = Flaky::transient(2); // fails twice, then calls on_paid
/// let consumer = Consumer::new(pool, "billing", "1")
///     .clock(event_test::TestClock::new()) // the pauses between retries take no real time
///     .on(flaky.wrap(on_paid));
/// let paid = event_test::envelope(OrderPaid { order_id: "o-1".into() }).build();
/// assert_eq!(consumer.deliver(&paid).await?, Outcome::Applied);
/// assert_eq!(flaky.calls(), 3);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Flaky {
    failures: Arc<AtomicU32>,
    calls: Arc<AtomicU32>,
    error: HandlerError,
}

impl Flaky {
    /// Fails the first `times` calls with a transient error (a dependency down).
    pub fn transient(times: u32) -> Flaky {
        Flaky::failing(
            times,
            HandlerError::Transient("failing on purpose (Flaky)".into()),
        )
    }

    /// Fails the first `times` calls with a permanent error (a payload it cannot take).
    pub fn permanent(times: u32) -> Flaky {
        Flaky::failing(
            times,
            HandlerError::Permanent("failing on purpose (Flaky)".into()),
        )
    }

    /// Fails the first `times` calls with `error`.
    pub fn failing(times: u32, error: HandlerError) -> Flaky {
        Flaky {
            failures: Arc::new(AtomicU32::new(times)),
            calls: Arc::new(AtomicU32::new(0)),
            error,
        }
    }

    /// Counts a call: the failure while failures are left, then `Ok`. Call it first in a
    /// handler the test writes.
    pub fn attempt(&self) -> Result<(), HandlerError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let failing = self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(1)
            })
            .is_ok();
        if failing {
            Err(self.error.clone())
        } else {
            Ok(())
        }
    }

    /// Makes it fail `times` more calls.
    pub fn fail_next(&self, times: u32) {
        self.failures.store(times, Ordering::SeqCst);
    }

    /// How many calls were made.
    pub fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }

    /// The service's handler `handler`, failing first as this says.
    pub fn wrap<C: ?Sized, E, H>(
        &self,
        handler: H,
    ) -> impl AsyncFn(&mut C, Delivered<E>) -> Result<(), HandlerError> + Clone + use<C, E, H>
    where
        H: AsyncFn(&mut C, Delivered<E>) -> Result<(), HandlerError> + Clone,
    {
        let flaky = self.clone();
        async move |conn: &mut C, event: Delivered<E>| {
            flaky.attempt()?;
            handler(conn, event).await
        }
    }

    /// The service's batch handler `handler`, failing first as this says (a call per batch).
    pub fn wrap_batch<C: ?Sized, E, H>(
        &self,
        handler: H,
    ) -> impl AsyncFn(&mut C, Vec<Delivered<E>>) -> Result<(), HandlerError> + Clone + use<C, E, H>
    where
        H: AsyncFn(&mut C, Vec<Delivered<E>>) -> Result<(), HandlerError> + Clone,
    {
        let flaky = self.clone();
        async move |conn: &mut C, events: Vec<Delivered<E>>| {
            flaky.attempt()?;
            handler(conn, events).await
        }
    }
}
