//! A consumer as a value: built by a function, held in a struct's field, and spawned onto its
//! own task (`tokio::spawn` needs its future `Send`, which `Consumer::boxed` proves at compile
//! time), consuming from NATS JetStream into SQLite with one `.on` and one `.on_batch` handler.

use std::time::Duration;

use event_sqlx::{
    BoxConsumer, ConsumeReport, Consumer, Delivered, Error, HandlerError, JetStreamSubscription,
    RelayConfig,
};
use event_tests::any_broker::durable;
use event_tests::any_broker::nats;
use event_tests::any_broker::stream_for;
use event_tests::db::{TestDb, unique};
use event_tests::fixtures::{Order, OrderPaid, OrderPlaced, commit_orders, placed_and_paid_to};
use event_tests::wait;
use sqlx::{Sqlite, SqliteConnection, SqlitePool};

const ORDERS: usize = 20;

async fn on_placed(
    conn: &mut SqliteConnection,
    placed: Delivered<OrderPlaced>,
) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO placed (order_id) VALUES (?)")
        .bind(&placed.order_id)
        .execute(conn)
        .await?;
    Ok(())
}

async fn on_paid(
    conn: &mut SqliteConnection,
    paid: Vec<Delivered<OrderPaid>>,
) -> Result<(), HandlerError> {
    for event in paid {
        sqlx::query("INSERT INTO paid (order_id) VALUES (?)")
            .bind(&event.envelope.aggregate_id)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// The consumer, returned from a function as a type the caller can name.
fn billing(pool: SqlitePool) -> BoxConsumer<Sqlite> {
    Consumer::new(pool, "billing", "1.0.0")
        .on(on_placed)
        .on_batch(on_paid)
        .boxed()
}

/// A service that owns its consumer and its subscription.
struct Billing {
    consumer: BoxConsumer<Sqlite>,
    subscription: JetStreamSubscription,
}

impl Billing {
    /// Runs the service on a task of its own until `stop` fires.
    fn spawn(
        self,
        stop: tokio::sync::oneshot::Receiver<()>,
    ) -> tokio::task::JoinHandle<Result<ConsumeReport, Error>> {
        tokio::spawn(async move {
            self.subscription
                .run(&self.consumer, async move {
                    let _ = stop.await;
                })
                .await
        })
    }
}

async fn count(pool: &SqlitePool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_boxed_consumer_is_returned_stored_and_spawned() {
    let Some(publisher) = nats().await else {
        return;
    };
    let db = TestDb::sqlite().await.unwrap();
    let pool = db.pool().clone();
    for table in [
        "CREATE TABLE placed (order_id TEXT PRIMARY KEY)",
        "CREATE TABLE paid (order_id TEXT PRIMARY KEY)",
    ] {
        sqlx::query(table).execute(&pool).await.unwrap();
    }
    let topic = unique("boxed");
    let stream = stream_for(&publisher, &topic).await.unwrap();
    let outbox = placed_and_paid_to(&pool, &topic);
    for i in 0..ORDERS {
        commit_orders(&outbox, [Order::paid(&format!("o-{i:02}"), 100)]).await;
    }
    let relayed = outbox
        .relay(publisher.clone(), RelayConfig::new("relay-1"))
        .drain()
        .await
        .unwrap();
    assert_eq!(relayed.published, 2 * ORDERS);

    let consumer = billing(pool.clone());
    let mut handled = consumer.event_types();
    handled.sort_unstable();
    assert_eq!(handled, ["ORDER_PAID", "ORDER_PLACED"]);
    let service = Billing {
        consumer,
        subscription: durable(&publisher, &stream, "billing", &format!("{topic}.>"))
            .await
            .batch(10),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let running = service.spawn(stopped);
    wait::until(Duration::from_secs(60), async || {
        let (placed, paid) = (
            count(&pool, "SELECT COUNT(*) FROM placed").await,
            count(&pool, "SELECT COUNT(*) FROM paid").await,
        );
        if placed == ORDERS as i64 && paid == ORDERS as i64 {
            Ok(())
        } else {
            Err(format!("{placed} placed and {paid} paid of {ORDERS} each"))
        }
    })
    .await;
    stop.send(()).unwrap();
    let report = running.await.unwrap().unwrap();
    assert_eq!(report.applied, 2 * ORDERS, "{report:?}");
    assert_eq!(report.quarantined, 0, "{report:?}");
    db.cleanup().await;
}
