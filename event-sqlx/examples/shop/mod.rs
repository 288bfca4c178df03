//! The shop the broker examples share: an order aggregate and its events, the commands that
//! commit them through the outbox, and a billing consumer that a function returns.

use event_core::{Aggregate, DomainEvent, EventContext, RecordError, RecordedEvents, UnitOfWork};
use event_sqlx::{
    BoxConsumer, ConsumeReport, Consumer, Delivered, HandlerError, Outbox, OutboxConfig,
};
use sqlx::Sqlite;
use sqlx::sqlite::{SqliteConnection, SqlitePool, SqlitePoolOptions};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(aggregate = "ORDER", event_no = "ORDER_PLACED:{order_id}")]
pub(crate) struct OrderPlaced {
    #[domain_event(aggregate_id)]
    pub(crate) order_id: String,
    pub(crate) amount_minor: i64,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(aggregate = "ORDER", event_no = "ORDER_PAID:{order_id}")]
pub(crate) struct OrderPaid {
    #[domain_event(aggregate_id)]
    pub(crate) order_id: String,
    pub(crate) amount_minor: i64,
}

#[derive(Aggregate)]
#[aggregate(type = "ORDER")]
pub(crate) struct Order {
    #[aggregate(id)]
    id: String,
    events: RecordedEvents,
}

impl Order {
    /// A new order, placed and paid.
    fn place_and_pay(id: &str, amount_minor: i64) -> Result<Order, RecordError> {
        let mut order = Order {
            id: id.to_owned(),
            events: RecordedEvents::new(),
        };
        order.record(OrderPlaced {
            order_id: id.to_owned(),
            amount_minor,
        })?;
        order.record(OrderPaid {
            order_id: id.to_owned(),
            amount_minor,
        })?;
        Ok(order)
    }
}

/// A database of its own in memory (one connection: the database lives in it), with the outbox's
/// tables and the shop's.
pub(crate) async fn database() -> Result<(SqlitePool, Outbox<Sqlite>), Box<dyn std::error::Error>> {
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect("sqlite::memory:")
        .await?;
    let outbox = Outbox::new(pool.clone(), OutboxConfig::new());
    outbox.migrate().await?;
    sqlx::query("CREATE TABLE orders (id TEXT PRIMARY KEY, amount_minor INTEGER NOT NULL)")
        .execute(&pool)
        .await?;
    sqlx::query("CREATE TABLE bill (order_id TEXT PRIMARY KEY, amount_minor INTEGER NOT NULL)")
        .execute(&pool)
        .await?;
    Ok((pool, outbox))
}

/// `count` orders, each placed and paid in one command: the order's row and its events commit in
/// one transaction.
/// A run tags its orders with `run`, so that events left on a broker by an earlier run are
/// other orders, not the same ones again.
pub(crate) async fn place_orders(
    pool: &SqlitePool,
    outbox: &Outbox<Sqlite>,
    run: &str,
    count: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    for i in 1..=count {
        let (id, amount) = (format!("{run}-o-{i}"), 1000 * i as i64);
        let mut order = Order::place_and_pay(&id, amount)?;
        let mut uow = UnitOfWork::new(EventContext::new("order-service"));
        uow.collect(&mut order)?;
        let mut tx = pool.begin().await?;
        sqlx::query("INSERT INTO orders (id, amount_minor) VALUES (?, ?)")
            .bind(&id)
            .bind(amount)
            .execute(&mut *tx)
            .await?;
        if outbox.commit(tx, uow).await?.already_applied() {
            println!("{id} was placed before: nothing committed");
        }
    }
    Ok(())
}

async fn bill(tx: &mut SqliteConnection, paid: Delivered<OrderPaid>) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO bill (order_id, amount_minor) VALUES (?, ?)")
        .bind(&paid.order_id)
        .bind(paid.amount_minor)
        .execute(tx)
        .await?;
    Ok(())
}

async fn placed(
    _tx: &mut SqliteConnection,
    placed: Delivered<OrderPlaced>,
) -> Result<(), HandlerError> {
    println!(
        "placed {} for {} cents",
        placed.order_id, placed.amount_minor
    );
    Ok(())
}

/// The billing consumer: a bill per paid order, in the transaction that records the event in the
/// inbox. Boxed, so a function can return it and a task can own it.
pub(crate) fn billing(pool: SqlitePool) -> BoxConsumer<Sqlite> {
    Consumer::new(pool, "billing", "1.0.0")
        .on(placed)
        .on(bill)
        .boxed()
}

/// Prints what the consumer did, and fails unless every order of this run was billed once.
pub(crate) async fn report(
    pool: &SqlitePool,
    run: &str,
    count: usize,
    consumed: ConsumeReport,
) -> Result<(), Box<dyn std::error::Error>> {
    let billed: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM bill WHERE order_id LIKE ?")
        .bind(format!("{run}-%"))
        .fetch_one(pool)
        .await?;
    println!(
        "consumer: {} applied, {} duplicates, {} ignored; {billed} of {count} orders billed",
        consumed.applied, consumed.duplicates, consumed.ignored
    );
    if billed as usize != count {
        return Err(format!("{billed} of {count} orders billed").into());
    }
    Ok(())
}

/// A tag for this run's orders.
pub(crate) fn run_id() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!("r{}", now.as_millis())
}
