//! `eventctl demo`: an order service on an SQLite file, with nothing to install.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use event_core::{Aggregate, DomainEvent, EventContext, RecordError, RecordedEvents, UnitOfWork};
use event_sqlx::{JsonLinesPublisher, Outbox, OutboxConfig, RelayConfig};
use serde::{Deserialize, Serialize};
use sqlx::{Sqlite, SqlitePool, Transaction};

/// `eventctl demo`.
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// The SQLite file to (re)create.
    #[arg(long, default_value = "eventctl-demo.db")]
    db: PathBuf,
    /// How many orders to place and pay (1 to 1000).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
    orders: u32,
}

/// An order was placed.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(aggregate = "ORDER", event_no = "ORDER_PLACED:{order_id}")]
struct OrderPlaced {
    #[domain_event(aggregate_id)]
    order_id: String,
    amount_minor: i64,
    currency: String,
}

/// An order was paid. Its event number is the business identity: one payment per order.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(aggregate = "ORDER", event_no = "ORDER_PAID:{order_id}")]
struct OrderPaid {
    #[domain_event(aggregate_id)]
    order_id: String,
    amount_minor: i64,
    payment_ref: String,
}

#[derive(Aggregate)]
#[aggregate(type = "ORDER")]
struct Order {
    #[aggregate(id)]
    id: String,
    amount_minor: i64,
    status: String,
    events: RecordedEvents,
}

impl Order {
    fn place(id: String, amount_minor: i64) -> Result<Order, RecordError> {
        let mut order = Order {
            id,
            amount_minor,
            status: "PLACED".into(),
            events: RecordedEvents::new(),
        };
        order.record(OrderPlaced {
            order_id: order.id.clone(),
            amount_minor,
            currency: "EUR".into(),
        })?;
        Ok(order)
    }

    fn pay(&mut self, payment_ref: &str) -> Result<(), RecordError> {
        if self.status == "PAID" {
            return Ok(());
        }
        self.status = "PAID".into();
        self.record(OrderPaid {
            order_id: self.id.clone(),
            amount_minor: self.amount_minor,
            payment_ref: payment_ref.to_owned(),
        })
    }
}

/// The order repository: the order row and its events in one transaction.
struct Orders {
    pool: SqlitePool,
    outbox: Outbox<Sqlite>,
}

impl Orders {
    async fn load(&self, id: &str) -> anyhow::Result<Order> {
        let (amount_minor, status, version): (i64, String, i64) =
            sqlx::query_as("SELECT amount_minor, status, version FROM orders WHERE id = ?")
                .bind(id)
                .fetch_one(&self.pool)
                .await
                .with_context(|| format!("order {id} not found"))?;
        Ok(Order {
            id: id.to_owned(),
            amount_minor,
            status,
            events: RecordedEvents::loaded_at(u64::try_from(version).unwrap_or(0)),
        })
    }

    async fn save(
        &self,
        order: &mut Order,
        context: EventContext,
    ) -> anyhow::Result<event_sqlx::Commit> {
        let mut uow = UnitOfWork::new(context);
        uow.collect(order)?;
        let mut tx: Transaction<'_, Sqlite> = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO orders (id, amount_minor, status, version) VALUES (?, ?, ?, ?) \
             ON CONFLICT (id) DO UPDATE SET status = excluded.status, version = MAX(orders.version, excluded.version)",
        )
        .bind(&order.id)
        .bind(order.amount_minor)
        .bind(&order.status)
        .bind(i64::try_from(order.events.version()).unwrap_or(i64::MAX))
        .execute(&mut *tx)
        .await?;
        Ok(self.outbox.commit(tx, uow).await?)
    }
}

pub(crate) async fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let path = args.db.display().to_string();
    for suffix in ["", "-wal", "-shm"] {
        let file = format!("{path}{suffix}");
        if std::path::Path::new(&file).exists() {
            std::fs::remove_file(&file).with_context(|| format!("cannot replace {file}"))?;
        }
    }
    let url = format!("sqlite://{path}?mode=rwc");
    let pool = SqlitePool::connect(&url)
        .await
        .with_context(|| format!("cannot create the SQLite file {path}"))?;
    sqlx::query("CREATE TABLE orders (id TEXT PRIMARY KEY, amount_minor INTEGER NOT NULL, status TEXT NOT NULL, version INTEGER NOT NULL)")
        .execute(&pool)
        .await?;
    let outbox = Outbox::new(pool.clone(), OutboxConfig::new());
    outbox.migrate().await?;
    let orders = Orders {
        pool: pool.clone(),
        outbox: outbox.clone(),
    };
    println!(
        "order service on {path}: placing and paying {} orders",
        args.orders
    );

    let (mut recorded, mut absorbed) = (0, 0);
    let context = || EventContext::new("order-service").tenant_id("demo");
    for i in 1..=args.orders {
        let id = format!("o-{i}");
        let mut order = Order::place(id.clone(), 1000 * i64::from(i))?;
        recorded += orders
            .save(
                &mut order,
                context().correlation_id(format!("checkout-{i}")),
            )
            .await?
            .report()
            .recorded
            .len();

        // The payment provider calls the webhook; for the first order it calls twice, and both
        // handlers load the order before either commits.
        let mut first = orders.load(&id).await?;
        let mut second = orders.load(&id).await?;
        first.pay(&format!("pay-{i}"))?;
        recorded += orders
            .save(
                &mut first,
                context().correlation_id(format!("checkout-{i}")),
            )
            .await?
            .report()
            .recorded
            .len();
        if i == 1 {
            second.pay(&format!("pay-{i}"))?;
            let commit = orders
                .save(
                    &mut second,
                    context().correlation_id(format!("checkout-{i}")),
                )
                .await?;
            if commit.already_applied() {
                for no in &commit.report().already_recorded {
                    println!(
                        "duplicate webhook for {id}: {no} was already recorded; its transaction was rolled back, nothing written twice"
                    );
                }
            }
            absorbed += commit.report().already_recorded.len();
        }
    }
    println!(
        "recorded {recorded} events in {} business transactions\n",
        recorded + absorbed
    );

    println!("relay: publishing the committed events as JSON lines");
    let relay = outbox.relay(JsonLinesPublisher::stdout(), RelayConfig::new("demo-relay"));
    let published = relay.drain().await?.published;
    let pending = outbox.pending(1000).await?.len();
    let paid: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orders WHERE status = 'PAID'")
        .fetch_one(&pool)
        .await?;
    println!();
    println!("summary");
    println!("  orders placed and paid: {paid}");
    println!("  events recorded:        {recorded}");
    println!("  duplicates absorbed:    {absorbed}");
    println!("  events published:       {published}");
    println!("  events still pending:   {pending}");
    println!();
    println!("look around:");
    println!("  eventctl outbox aggregate --database-url sqlite://{path} ORDER o-1");
    println!("  eventctl outbox status --database-url sqlite://{path}");
    pool.close().await;
    Ok(if pending == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

#[cfg(test)]
mod tests {
    //! The demo's order service under the test kit: its aggregate alone, then its repository
    //! with the real outbox and relay, a consumer and a duplicate webhook, on SQLite in memory.

    use event_sqlx::{Consumer, Delivered};
    use event_test::{AggregateTest, Expected, Harness};
    use serde_json::json;

    use super::*;

    #[test]
    fn an_order_is_paid_once() {
        let order = Order::place("o-1".into(), 1000).expect("place");
        let mut test = AggregateTest::new(order)
            .context(EventContext::new("order-service").correlation_id("checkout-1"));
        // Placing recorded OrderPlaced; the first command collects it.
        test.when(|_| Ok::<_, RecordError>(()))
            .then_events([Expected::like::<OrderPlaced>(json!({ "currency": "EUR" }))
                .event_no("ORDER_PLACED:o-1")
                .sequence(1)]);
        test.when(|order| order.pay("pay-1"))
            .then_events([Expected::event(OrderPaid {
                order_id: "o-1".into(),
                amount_minor: 1000,
                payment_ref: "pay-1".into(),
            })
            .event_no("ORDER_PAID:o-1")
            .sequence(2)
            .header("correlationId", "checkout-1")]);
        test.when(|order| order.pay("pay-1")).then_no_events();
        assert_eq!(test.aggregate().status, "PAID");
    }

    #[tokio::test]
    async fn a_duplicate_webhook_is_absorbed_and_every_event_reaches_a_consumer_once() {
        let mut h = Harness::new().await.expect("harness");
        sqlx::query("CREATE TABLE orders (id TEXT PRIMARY KEY, amount_minor INTEGER NOT NULL, status TEXT NOT NULL, version INTEGER NOT NULL)")
            .execute(h.pool())
            .await
            .expect("orders table");
        h.consumer(
            Consumer::new(h.pool().clone(), "ledger", "1")
                .on(async |_tx: &mut sqlx::SqliteConnection, _paid: Delivered<OrderPaid>| Ok(())),
        );
        let orders = Orders {
            pool: h.pool().clone(),
            outbox: h.outbox().clone(),
        };
        let mut order = Order::place("o-1".into(), 1000).expect("place");
        let _ = orders
            .save(&mut order, h.context("order-service"))
            .await
            .expect("save");
        // Two webhooks load the order before either commits.
        let mut first = orders.load("o-1").await.expect("load");
        let mut second = orders.load("o-1").await.expect("load");
        first.pay("pay-1").expect("pay");
        second.pay("pay-1").expect("pay");
        let committed = orders.save(&mut first, h.context("order-service")).await;
        assert!(!committed.expect("first webhook").already_applied());
        let duplicate = orders.save(&mut second, h.context("order-service")).await;
        assert!(duplicate.expect("second webhook").already_applied());

        h.settle().await.expect("settled");
        h.assert_published([
            Expected::of_type::<OrderPlaced>().event_no("ORDER_PLACED:o-1"),
            Expected::of_type::<OrderPaid>().event_no("ORDER_PAID:o-1"),
        ]);
        h.assert_applied(
            "ledger",
            [Expected::like::<OrderPaid>(
                json!({ "payment_ref": "pay-1" }),
            )],
        );
    }
}
