//! A small order domain used across the tests.

use event_core::{Aggregate, DomainEvent, EventContext, RecordError, RecordedEvents, UnitOfWork};
use event_sqlx::{Backend, Outbox};
use serde::{Deserialize, Serialize};

use crate::db::{Orders, TestDb};

/// The context of the order service's commands: its name and tenant.
pub fn context() -> EventContext {
    EventContext::new("order-service").tenant_id("acme")
}

/// Places `id` (and pays it, when `paid`) and commits the order row and its events together.
pub async fn place<DB: Orders>(db: &TestDb<DB>, id: &str, paid: bool) {
    let mut order = Order::place(id, 1000).unwrap();
    if paid {
        order.pay(1000).unwrap();
    }
    let mut tx = db.pool().begin().await.unwrap();
    DB::save_order(&mut tx, id, if paid { "PAID" } else { "PLACED" }, 1)
        .await
        .unwrap();
    let mut uow = UnitOfWork::new(context());
    uow.collect(&mut order).unwrap();
    let _ = db.outbox.commit(tx, uow).await.unwrap();
}

/// Commits `orders`' events in one unit of work of the order service, with no business row: the
/// backlog most relay and consumer tests start from.
pub async fn commit_orders<DB: Backend>(
    outbox: &Outbox<DB>,
    orders: impl IntoIterator<Item = Order>,
) {
    let mut uow = UnitOfWork::new(EventContext::new("order-service"));
    for mut order in orders {
        uow.collect(&mut order).unwrap();
    }
    let _ = outbox
        .commit(outbox.pool().begin().await.unwrap(), uow)
        .await
        .unwrap();
}

/// The message bodies a broker would carry for `uow`'s events: each envelope as JSON.
pub fn bodies(uow: UnitOfWork) -> Vec<Vec<u8>> {
    uow.commit()
        .iter()
        .map(|e| serde_json::to_vec(e).unwrap())
        .collect()
}

/// An outbox on `pool` routing `ORDER_PLACED` to `topic`, routing key `order.placed`.
pub fn orders_to<DB: Backend>(pool: &sqlx::Pool<DB>, topic: &str) -> Outbox<DB> {
    let route = event_sqlx::Route::topic(topic).routing_key("order.placed");
    Outbox::new(
        pool.clone(),
        event_sqlx::OutboxConfig::new().route("ORDER_PLACED", route),
    )
}

/// An outbox on `pool` routing `ORDER_PLACED` and `ORDER_PAID` to `topic`, routing keys
/// `order.placed` and `order.paid`.
pub fn placed_and_paid_to<DB: Backend>(pool: &sqlx::Pool<DB>, topic: &str) -> Outbox<DB> {
    let route = |key: &str| event_sqlx::Route::topic(topic).routing_key(key);
    Outbox::new(
        pool.clone(),
        event_sqlx::OutboxConfig::new()
            .route("ORDER_PLACED", route("order.placed"))
            .route("ORDER_PAID", route("order.paid")),
    )
}

/// An order was placed. No template: the unit of work assigns the event number.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(aggregate = "ORDER")]
pub struct OrderPlaced {
    /// The order.
    #[domain_event(aggregate_id)]
    pub order_id: String,
    /// The total, in minor units.
    pub amount_minor: i64,
}

/// An order was paid; the template makes the event number the business identity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(
    event_type = "ORDER_PAID",
    version = 2,
    aggregate = "ORDER",
    event_no = "ORDER_PAID:{order_id}"
)]
pub struct OrderPaid {
    /// The order.
    #[domain_event(aggregate_id)]
    pub order_id: String,
    /// The amount paid, in minor units.
    pub amount_minor: i64,
    /// ISO 4217 currency code.
    pub currency: String,
}

/// A payment was captured: an event of another aggregate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(aggregate = "PAYMENT")]
pub struct PaymentCaptured {
    /// The payment.
    #[domain_event(aggregate_id)]
    pub payment_id: String,
}

/// An event that names no aggregate: it can be recorded on any.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
pub struct NoteAdded {
    /// The note.
    pub text: String,
}

/// The order aggregate.
#[derive(Debug, Aggregate)]
#[aggregate(type = "ORDER")]
pub struct Order {
    /// The order id.
    #[aggregate(id)]
    pub id: String,
    /// Whether it was paid.
    pub paid: bool,
    /// Its recorded events.
    pub events: RecordedEvents,
}

impl Order {
    /// Places a new order.
    pub fn place(id: &str, amount_minor: i64) -> Result<Order, RecordError> {
        let mut order = Order::loaded(id, 0, false);
        order.record(OrderPlaced {
            order_id: id.to_owned(),
            amount_minor,
        })?;
        Ok(order)
    }

    /// An order as loaded from its table at `version` (its last event's sequence; 0 for new).
    pub fn loaded(id: &str, version: u64, paid: bool) -> Order {
        Order {
            id: id.to_owned(),
            paid,
            events: RecordedEvents::loaded_at(version),
        }
    }

    /// An order placed and paid, `amount_minor` each time: two events.
    pub fn paid(id: &str, amount_minor: i64) -> Order {
        let mut order = Order::place(id, amount_minor).unwrap();
        order.pay(amount_minor).unwrap();
        order
    }

    /// Adds a note: an event of no aggregate type, recorded on the order.
    pub fn note(&mut self, text: &str) {
        self.record(NoteAdded {
            text: text.to_owned(),
        })
        .unwrap();
    }

    /// Pays the order; paying twice records nothing the second time.
    pub fn pay(&mut self, amount_minor: i64) -> Result<(), RecordError> {
        if self.paid {
            return Ok(());
        }
        self.paid = true;
        self.record(OrderPaid {
            order_id: self.id.clone(),
            amount_minor,
            currency: "EUR".to_owned(),
        })
    }
}

/// The payment aggregate.
#[derive(Debug, Aggregate)]
#[aggregate(type = "PAYMENT")]
pub struct Payment {
    /// The payment id.
    #[aggregate(id)]
    pub id: String,
    /// Its recorded events.
    pub events: RecordedEvents,
}

/// Refuses the events of the listed aggregates ("broker refused it"); passes the rest to
/// `inner`. Leaves failed events behind for tests of retries, skips and operators' pages.
pub struct Refusing<P> {
    /// Where the other events go.
    pub inner: P,
    /// The aggregate ids whose events are refused.
    pub refused: std::collections::HashSet<String>,
}

impl<P: event_sqlx::Publisher> Refusing<P> {
    /// Refuses the events of `aggregate_ids`.
    pub fn new(inner: P, aggregate_ids: &[&str]) -> Refusing<P> {
        Refusing {
            inner,
            refused: aggregate_ids.iter().map(|id| (*id).to_owned()).collect(),
        }
    }
}

impl<P: event_sqlx::Publisher> event_sqlx::Publisher for Refusing<P> {
    async fn publish(
        &self,
        messages: &[event_sqlx::OutboxMessage],
    ) -> Vec<Result<(), event_sqlx::PublishError>> {
        let mut results = Vec::new();
        for message in messages {
            if self.refused.contains(&message.envelope.aggregate_id) {
                results.push(Err(event_sqlx::PublishError::new("broker refused it")));
            } else {
                results.extend(self.inner.publish(std::slice::from_ref(message)).await);
            }
        }
        results
    }
}
