//! An order service and a billing consumer in one process, on SQLite in memory: the order and its
//! events commit in one transaction, the relay publishes them into a channel, the consumer applies
//! each once (the second delivery of the same event is a duplicate).
//!
//! `cargo run -p event-sqlx --example outbox_to_consumer`

use event_core::{Aggregate, DomainEvent, EventContext, RecordError, RecordedEvents, UnitOfWork};
use event_sqlx::{ChannelPublisher, Consumer, Delivered, Outbox, OutboxConfig, RelayConfig};
use sqlx::sqlite::{SqliteConnection, SqlitePoolOptions};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(aggregate = "ORDER", event_no = "ORDER_PLACED:{order_id}")]
struct OrderPlaced {
    #[domain_event(aggregate_id)]
    order_id: String,
    amount_minor: i64,
}

struct Order {
    id: String,
    events: RecordedEvents,
}

impl Aggregate for Order {
    const AGGREGATE_TYPE: &'static str = "ORDER";
    fn aggregate_id(&self) -> String {
        self.id.clone()
    }
    fn recorded_events(&mut self) -> &mut RecordedEvents {
        &mut self.events
    }
}

impl Order {
    fn place(id: &str, amount_minor: i64) -> Result<Order, RecordError> {
        let mut order = Order {
            id: id.to_owned(),
            events: RecordedEvents::new(),
        };
        order.record(OrderPlaced {
            order_id: id.to_owned(),
            amount_minor,
        })?;
        Ok(order)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // One connection: an in-memory SQLite database lives in its connection.
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect("sqlite::memory:")
        .await?;
    let outbox = Outbox::new(pool.clone(), OutboxConfig::new());
    outbox.migrate().await?;
    sqlx::query("CREATE TABLE orders (id TEXT PRIMARY KEY, amount_minor INTEGER NOT NULL)")
        .execute(&pool)
        .await?;
    sqlx::query("CREATE TABLE bill (order_id TEXT NOT NULL, amount_minor INTEGER NOT NULL)")
        .execute(&pool)
        .await?;

    // The order service: state and events in one transaction.
    for (id, amount) in [("o-1", 1999), ("o-2", 500)] {
        let mut order = Order::place(id, amount)?;
        let mut uow = UnitOfWork::new(EventContext::new("order-service"));
        uow.collect(&mut order)?;
        let mut tx = pool.begin().await?;
        sqlx::query("INSERT INTO orders (id, amount_minor) VALUES (?, ?)")
            .bind(id)
            .bind(amount)
            .execute(&mut *tx)
            .await?;
        outbox.commit(tx, uow).await?;
    }

    // The relay: every committed event into a channel.
    let (publisher, mut messages) = ChannelPublisher::channel(100);
    let published = outbox
        .relay(publisher, RelayConfig::new("example-relay"))
        .drain()
        .await?
        .published;
    println!("relayed {published} events");

    // The billing consumer: one bill per order, whatever arrives twice.
    let billing = Consumer::new(pool.clone(), "billing", "1.0.0").on(
        async |tx: &mut SqliteConnection, placed: Delivered<OrderPlaced>| {
            sqlx::query("INSERT INTO bill (order_id, amount_minor) VALUES (?, ?)")
                .bind(&placed.order_id)
                .bind(placed.amount_minor)
                .execute(&mut *tx)
                .await?;
            Ok(())
        },
    );
    while let Ok(message) = messages.try_recv() {
        let body = serde_json::to_vec(&message.envelope)?;
        let first = billing.receive(&body, None).await?;
        let again = billing.receive(&body, None).await?;
        println!("{}: {first:?}, then {again:?}", message.envelope.event_id);
    }
    let bills: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM bill")
        .fetch_one(&pool)
        .await?;
    println!("bills: {bills}");
    Ok(())
}
