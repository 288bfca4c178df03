//! An order service writes through the outbox, the relay publishes to NATS JetStream, an invoice
//! consumer creates invoices. Whatever is redelivered, replayed or crashes in between, every
//! paid order has exactly one invoice.

use std::time::Duration;

use event_core::{EventContext, UnitOfWork};
use event_sqlx::{
    Consumer, Delivered, FailureClass, HandlerError, JetStreamSubscription, Outbox, Processed,
    RelayConfig,
};
use event_tests::any_broker::stream_for;
use event_tests::any_broker::{nats, rabbitmq};
use event_tests::db::{TestDb, amqp_url, unique};
use event_tests::fixtures::{Order, OrderPaid, commit_orders, placed_and_paid_to};
use futures_util::StreamExt;

const ORDERS: i64 = 10;

async fn invoices(pool: &sqlx::SqlitePool) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM invoice")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The invoice consumer's handler: one invoice per paid order, in the consumer's transaction.
async fn invoice(
    tx: &mut sqlx::SqliteConnection,
    paid: Delivered<OrderPaid>,
) -> Result<(), HandlerError> {
    if paid.amount_minor == 999 {
        return Err(HandlerError::Permanent(
            "amount 999 is a test amount, refused".into(),
        ));
    }
    sqlx::query("INSERT INTO invoice (order_id, amount_minor) VALUES (?, ?)")
        .bind(&paid.order_id)
        .bind(paid.amount_minor)
        .execute(&mut *tx)
        .await
        .map_err(|e| HandlerError::Transient(e.to_string()))?;
    Ok(())
}

/// The order service: both events routed to `topic` (per-aggregate order holds ORDER_PAID until
/// ORDER_PLACED is out), and `ORDERS` orders placed and paid, each with its state and events in
/// one transaction.
async fn order_service(pool: &sqlx::SqlitePool, topic: &str) -> Outbox<sqlx::Sqlite> {
    let outbox = placed_and_paid_to(pool, topic);
    for i in 0..ORDERS {
        commit_orders(&outbox, [Order::paid(&format!("o-{i}"), 100 + i)]).await;
    }
    outbox
}

/// A drain of every order again applied nothing, counted each a duplicate, and left one invoice
/// per order.
async fn only_duplicates(report: &event_sqlx::ConsumeReport, pool: &sqlx::SqlitePool) {
    assert_eq!(
        (report.applied, report.duplicates),
        (0, ORDERS as usize),
        "{report:?}"
    );
    assert_eq!(
        invoices(pool).await,
        ORDERS,
        "still exactly one invoice per order"
    );
}

/// The billing service's database: SQLite with its `invoice` table.
async fn billing_db() -> TestDb<sqlx::Sqlite> {
    let db = TestDb::sqlite().await.unwrap();
    sqlx::query("CREATE TABLE invoice (order_id TEXT PRIMARY KEY, amount_minor INTEGER NOT NULL)")
        .execute(db.pool())
        .await
        .unwrap();
    db
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_paid_order_gets_exactly_one_invoice_through_jetstream() {
    let Some(publisher) = nats().await else {
        return;
    };
    let db = billing_db().await;
    let pool = db.pool().clone();
    let topic = unique("shop").replace('_', "-");
    let stream = stream_for(&publisher, &topic).await.unwrap();
    let outbox = order_service(&pool, &topic).await;
    let relay = outbox.relay(publisher.clone(), RelayConfig::new("relay"));
    relay.drain().await.unwrap();

    let consumer = Consumer::new(pool.clone(), "invoice-service", "1.4.2")
        .owner("billing-team")
        .on(invoice);
    let subject = format!("{topic}.order.paid");
    let ack_wait = Duration::from_millis(800);
    let subscription =
        JetStreamSubscription::durable(&publisher, &stream, "invoice-service", &subject, ack_wait)
            .await
            .unwrap();

    // A consumer process dies after committing three invoices and before acknowledging them.
    {
        let js = publisher.jetstream();
        let durable = js
            .get_stream(&stream)
            .await
            .unwrap()
            .get_consumer::<async_nats::jetstream::consumer::pull::Config>("invoice-service")
            .await
            .unwrap();
        let mut batch = durable.fetch().max_messages(3).messages().await.unwrap();
        while let Some(message) = batch.next().await {
            let message = message.unwrap();
            let outcome = consumer
                .process::<OrderPaid>(&message.payload, None, invoice)
                .await
                .unwrap();
            assert_eq!(outcome, Processed::Applied);
            // ... and the process is killed here: no ack.
        }
    }
    assert_eq!(invoices(&pool).await, 3);
    // The next consumer gets the seven never delivered, and the three again once JetStream's
    // ack wait for them has run out: poll until all ten came, with a deadline.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut report = event_sqlx::ConsumeReport::default();
    while report.applied + report.duplicates < ORDERS as usize {
        assert!(
            tokio::time::Instant::now() < deadline,
            "redeliveries never came: {report:?}"
        );
        let round = subscription
            .drain(&consumer, Duration::from_millis(200))
            .await
            .unwrap();
        report.applied += round.applied;
        report.duplicates += round.duplicates;
    }
    assert_eq!((report.applied, report.duplicates), (7, 3), "{report:?}");
    assert_eq!(invoices(&pool).await, ORDERS);

    // An operator republishes every payment, inside JetStream's duplicate window: each goes out
    // under a message id of its own, so the stream takes it and the consumer sees it.
    let paid = event_sqlx::Republish {
        event_type: Some("ORDER_PAID"),
        ..event_sqlx::Republish::default()
    };
    let republished = outbox.republish(&paid, &publisher).await.unwrap();
    assert_eq!(
        (
            republished.selected,
            republished.accepted,
            republished.failed
        ),
        (ORDERS as usize, ORDERS as usize, 0),
        "{republished:?}"
    );
    let report = subscription
        .drain(&consumer, Duration::from_millis(1500))
        .await
        .unwrap();
    only_duplicates(&report, &pool).await;

    // A poison message and an event the handler refuses are quarantined, and the rest goes on.
    publisher
        .jetstream()
        .publish(subject.clone(), "not an envelope".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let mut refused = Order::place("o-refused", 999).unwrap();
    refused.pay(999).unwrap();
    let mut uow = UnitOfWork::new(EventContext::new("order-service"));
    uow.collect(&mut refused).unwrap();
    let _ = outbox
        .commit(pool.begin().await.unwrap(), uow)
        .await
        .unwrap();
    relay.drain().await.unwrap();
    let report = subscription
        .drain(&consumer, Duration::from_millis(1500))
        .await
        .unwrap();
    assert_eq!(report.quarantined, 2, "{report:?}");
    let quarantined = consumer.quarantined(10).await.unwrap();
    assert_eq!(quarantined.len(), 2);
    let poison = quarantined.iter().find(|q| q.event_type.is_none()).unwrap();
    assert!(
        poison.reason.contains("not an event envelope"),
        "{}",
        poison.reason
    );
    let refused_entry = quarantined
        .iter()
        .find(|q| q.event_type.as_deref() == Some("ORDER_PAID"))
        .unwrap();
    assert_eq!(refused_entry.event_id, "ORDER_PAID:o-refused");
    assert_eq!(
        (
            refused_entry.failure_class,
            refused_entry.consumer_version.as_str()
        ),
        (FailureClass::Permanent, "1.4.2")
    );
    assert_eq!(refused_entry.owner.as_deref(), Some("billing-team"));

    // After the fix, the quarantine is replayed: the refused order gets its invoice; replaying
    // again changes nothing.
    let fixed = async |tx: &mut sqlx::SqliteConnection,
                       paid: Delivered<OrderPaid>|
           -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO invoice (order_id, amount_minor) VALUES (?, ?)")
            .bind(&paid.order_id)
            .bind(paid.amount_minor)
            .execute(&mut *tx)
            .await
            .map_err(|e| HandlerError::Transient(e.to_string()))?;
        Ok(())
    };
    assert_eq!(
        consumer.replay::<OrderPaid>(10, &fixed).await.unwrap(),
        1,
        "the poison body stays quarantined"
    );
    assert_eq!(invoices(&pool).await, ORDERS + 1);
    assert_eq!(consumer.replay::<OrderPaid>(10, &fixed).await.unwrap(), 0);
    assert_eq!(consumer.quarantined(10).await.unwrap().len(), 1);

    // A bug stops the consumer and leaves the message unacknowledged.
    publisher
        .jetstream()
        .publish(
            subject.clone(),
            serde_json::to_vec(
                &outbox
                    .by_event_no("ORDER_PAID:o-1")
                    .await
                    .unwrap()
                    .unwrap()
                    .envelope()
                    .unwrap(),
            )
            .unwrap()
            .into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    let other = Consumer::new(pool.clone(), "audit-service", "0.1.0").on(
        async |_tx: &mut sqlx::SqliteConnection, _paid: Delivered<OrderPaid>| {
            Err(HandlerError::Bug("index out of bounds".into()))
        },
    );
    let audit =
        JetStreamSubscription::durable(&publisher, &stream, "audit-service", &subject, ack_wait)
            .await
            .unwrap();
    let stopped = audit
        .drain(&other, Duration::from_millis(1000))
        .await
        .unwrap_err();
    assert!(
        stopped.to_string().contains("audit-service stopped"),
        "{stopped}"
    );
    // The handler's error is the stop's source, not text folded into it.
    let source = std::error::Error::source(&stopped)
        .and_then(|s| s.downcast_ref::<HandlerError>())
        .expect("the handler's error is the source");
    assert_eq!(source, &HandlerError::Bug("index out of bounds".into()));

    // Retention: inbox records past their window are pruned in batches.
    assert_eq!(
        consumer
            .prune_inbox(Duration::from_secs(3600), 5)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        consumer.prune_inbox(Duration::ZERO, 4).await.unwrap(),
        ORDERS as u64 + 1
    );

    publisher.jetstream().delete_stream(&stream).await.unwrap();
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_paid_order_gets_exactly_one_invoice_through_rabbitmq() {
    use event_sqlx::{RabbitMqPublisher, RabbitMqSubscription, Republish};
    use lapin::options::{BasicGetOptions, QueueDeleteOptions};
    use lapin::types::ShortString;

    let Some(publisher) = rabbitmq().await else {
        return;
    };
    let db = billing_db().await;
    let pool = db.pool().clone();
    let exchange = unique("shop").replace('_', "-");
    publisher.declare_exchange(&exchange).await.unwrap();
    let queue = format!("{exchange}-invoices");
    let subscription = RabbitMqSubscription::bind(&publisher, &exchange, &queue, "order.*")
        .await
        .unwrap();
    let outbox = order_service(&pool, &exchange).await;
    let relay = outbox.relay(publisher, RelayConfig::new("relay"));
    relay.drain().await.unwrap();

    let consumer = Consumer::new(pool.clone(), "invoice-service", "1.4.2").on(invoice);
    // A consumer takes three messages, commits their effects, and dies before acknowledging:
    // closing its channel returns them to the queue.
    {
        let doomed = RabbitMqPublisher::connect(&amqp_url()).await.unwrap();
        let mut committed = 0;
        while committed < 3 {
            let got = doomed
                .channel()
                .basic_get(
                    ShortString::from(queue.as_str()),
                    BasicGetOptions { no_ack: false },
                )
                .await
                .unwrap()
                .expect("a message");
            if consumer
                .process::<OrderPaid>(&got.delivery.data, None, invoice)
                .await
                .unwrap()
                == Processed::Applied
            {
                committed += 1;
            }
        }
        drop(doomed);
    }
    assert_eq!(invoices(&pool).await, 3);

    let idle = Duration::from_millis(1500);
    let report = subscription.drain(&consumer, idle).await.unwrap();
    assert_eq!((report.applied, report.duplicates), (7, 3), "{report:?}");
    assert_eq!(invoices(&pool).await, ORDERS);

    // Everything published again (relay replay): all duplicates.
    let again = RabbitMqPublisher::connect(&amqp_url()).await.unwrap();
    let paid = Republish {
        event_type: Some("ORDER_PAID"),
        ..Republish::default()
    };
    let republished = outbox.republish(&paid, &again).await.unwrap();
    assert_eq!(
        (republished.selected, republished.accepted),
        (ORDERS as usize, ORDERS as usize)
    );
    let report = subscription.drain(&consumer, idle).await.unwrap();
    only_duplicates(&report, &pool).await;

    again
        .channel()
        .queue_delete(
            ShortString::from(queue.as_str()),
            QueueDeleteOptions::default(),
        )
        .await
        .unwrap();
    db.cleanup().await;
}
