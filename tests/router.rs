//! One consumer for many event types: three event types on one stream (JetStream) or queue
//! (RabbitMQ), each to its typed handler, in order per aggregate, every handler seeing the
//! envelope; an event type without a handler is skipped or quarantined, as configured.

use std::time::Duration;

use event_core::{Aggregate, EventContext, UnitOfWork};
use event_sqlx::{
    Consumer, Delivered, HandlerError, NatsPublisher, Outbox, OutboxConfig, Processed,
    RabbitMqPublisher, RabbitMqSubscription, RelayConfig, Route, UnknownEvents,
};
use event_tests::any_broker::durable;
use event_tests::any_broker::nats;
use event_tests::any_broker::stream_for;
use event_tests::db::{TestDb, amqp_url, reachable, unique};
use event_tests::fixtures::{NoteAdded, Order, OrderPaid, OrderPlaced, Payment, PaymentCaptured};

const ORDERS: usize = 12;

/// Places, pays and annotates `ORDERS` orders, each step its own command and transaction, every
/// event routed to `topic` with a routing key per type; and captures one payment, an event
/// type the consumer has no handler for.
async fn order_service(pool: &sqlx::SqlitePool, topic: &str) -> Outbox<sqlx::Sqlite> {
    let route = |key: &str| Route::topic(topic).routing_key(key);
    let outbox = Outbox::new(
        pool.clone(),
        OutboxConfig::new()
            .route("ORDER_PLACED", route("order.placed"))
            .route("ORDER_PAID", route("order.paid"))
            .route("NOTE_ADDED", route("order.noted"))
            .route("PAYMENT_CAPTURED", route("order.captured")),
    );
    let context = |i: usize| {
        EventContext::new("order-service")
            .tenant_id("acme")
            .correlation_id(format!("checkout-{i}"))
    };
    for i in 0..ORDERS {
        let mut order = Order::place(&format!("o-{i:02}"), 100).unwrap();
        commit(&outbox, context(i), &mut order).await;
        order.pay(100).unwrap();
        commit(&outbox, context(i), &mut order).await;
        order.note("leave at the door");
        commit(&outbox, context(i), &mut order).await;
    }
    let mut payment = Payment {
        id: "p-1".into(),
        events: event_core::RecordedEvents::new(),
    };
    payment
        .record(PaymentCaptured {
            payment_id: "p-1".into(),
        })
        .unwrap();
    commit(&outbox, context(0), &mut payment).await;
    outbox
}

/// Commits what `aggregate` recorded as one command of `context`, in its own transaction.
async fn commit(
    outbox: &Outbox<sqlx::Sqlite>,
    context: EventContext,
    aggregate: &mut impl event_core::Aggregate,
) {
    let mut uow = UnitOfWork::new(context);
    uow.collect(aggregate).unwrap();
    let _ = outbox
        .commit(outbox.pool().begin().await.unwrap(), uow)
        .await
        .unwrap();
}

/// Records what a handler saw, in the order the handlers ran.
async fn seen(
    tx: &mut sqlx::SqliteConnection,
    envelope: &event_core::EventEnvelope,
    what: &str,
    causation: Option<String>,
) -> Result<(), HandlerError> {
    sqlx::query(
        "INSERT INTO seen (aggregate_id, sequence, event_type, what, event_id, causation_id, \
         correlation_id) VALUES (?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(&envelope.aggregate_id)
    .bind(envelope.aggregate_sequence as i64)
    .bind(&envelope.event_type)
    .bind(what)
    .bind(envelope.event_id.as_str())
    .bind(causation)
    .bind(envelope.headers.correlation_id.as_deref())
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// The order view: one consumer, a handler for each of the three order event types. A macro,
/// not a function: a function would return the consumer as `impl Routes`, which hides whether
/// its handlers' futures are `Send`, and a spawned task needs to know.
macro_rules! order_view {
    ($pool:expr, $unknown:expr) => {
        Consumer::new($pool.clone(), "order-view", "1.0.0")
            .unknown_events($unknown)
            .on(
                async |tx: &mut sqlx::SqliteConnection, placed: Delivered<OrderPlaced>| {
                    let what = format!("placed {}", placed.amount_minor);
                    seen(tx, &placed.envelope, &what, None).await
                },
            )
            .on(
                async |tx: &mut sqlx::SqliteConnection, paid: Delivered<OrderPaid>| {
                    // What the handler would record next is caused by this event.
                    let context = paid.context("order-view");
                    let what = format!("paid {} {}", paid.amount_minor, paid.currency);
                    seen(
                        tx,
                        &paid.envelope,
                        &what,
                        context.headers().causation_id.clone(),
                    )
                    .await
                },
            )
            .on(
                async |tx: &mut sqlx::SqliteConnection, note: Delivered<NoteAdded>| {
                    let what = format!("noted {}", note.text);
                    seen(tx, &note.envelope, &what, None).await
                },
            )
    };
}

async fn prepare(pool: &sqlx::SqlitePool) {
    sqlx::query(
        "CREATE TABLE seen (n INTEGER PRIMARY KEY AUTOINCREMENT, aggregate_id TEXT NOT NULL, \
         sequence INTEGER NOT NULL, event_type TEXT NOT NULL, what TEXT NOT NULL, \
         event_id TEXT NOT NULL, causation_id TEXT, correlation_id TEXT)",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// aggregate_id, sequence, event_type, what, event_id, causation_id, correlation_id.
type SeenRow = (
    String,
    i64,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
);

/// Every order's three events reached their handlers once, in sequence order, with their
/// envelopes.
async fn assert_every_event_in_order(pool: &sqlx::SqlitePool) {
    let rows: Vec<SeenRow> = sqlx::query_as(
        "SELECT aggregate_id, sequence, event_type, what, event_id, causation_id, \
             correlation_id FROM seen ORDER BY n",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), ORDERS * 3, "{rows:?}");
    for i in 0..ORDERS {
        let id = format!("o-{i:02}");
        let mine: Vec<_> = rows.iter().filter(|r| r.0 == id).collect();
        let order: Vec<(i64, &str)> = mine.iter().map(|r| (r.1, r.2.as_str())).collect();
        assert_eq!(
            order,
            vec![(1, "ORDER_PLACED"), (2, "ORDER_PAID"), (3, "NOTE_ADDED")],
            "order of {id}"
        );
        assert_eq!(mine[0].3, "placed 100");
        assert_eq!(mine[1].3, "paid 100 EUR");
        assert_eq!(mine[2].3, "noted leave at the door");
        let paid = mine[1];
        assert_eq!(
            paid.5.as_deref(),
            Some(paid.4.as_str()),
            "the handler's context names the event as its cause"
        );
        assert_eq!(paid.6.as_deref(), Some(format!("checkout-{i}").as_str()));
    }
}

/// A NATS publisher, a fresh SQLite database with the `seen` table, a topic and the stream that
/// captures it; `None` (the test is skipped) when NATS is unreachable and not required.
async fn shop_on_jetstream() -> Option<(NatsPublisher, TestDb<sqlx::Sqlite>, String, String)> {
    let publisher = nats().await?;
    let db = TestDb::sqlite().await.unwrap();
    prepare(db.pool()).await;
    let topic = unique("shop").replace('_', "-");
    let stream = stream_for(&publisher, &topic).await.unwrap();
    Some((publisher, db, topic, stream))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_consumer_takes_three_event_types_from_one_jetstream_stream() {
    let Some((publisher, db, topic, stream)) = shop_on_jetstream().await else {
        return;
    };
    let pool = db.pool().clone();
    let outbox = order_service(&pool, &topic).await;
    let relay = outbox.relay(publisher.clone(), RelayConfig::new("relay"));
    assert_eq!(relay.drain().await.unwrap().published, ORDERS * 3 + 1);

    let view = order_view!(&pool, UnknownEvents::Ignore);
    assert_eq!(
        view.event_types(),
        vec!["ORDER_PLACED", "ORDER_PAID", "NOTE_ADDED"]
    );
    let subscription = durable(&publisher, &stream, "order-view", &format!("{topic}.>")).await;
    let report = subscription
        .drain(&view, Duration::from_millis(500))
        .await
        .unwrap();
    assert_eq!(
        (report.applied, report.ignored, report.quarantined),
        (ORDERS * 3, 1, 0),
        "{report:?}"
    );
    assert_every_event_in_order(&pool).await;

    // Another view that must handle everything on its subjects quarantines the payment.
    let strict = Consumer::new(pool.clone(), "strict-view", "1.0.0")
        .unknown_events(UnknownEvents::Quarantine)
        .on(async |_tx: &mut sqlx::SqliteConnection, _placed: Delivered<OrderPlaced>| Ok(()));
    let subscription = durable(
        &publisher,
        &stream,
        "strict-view",
        &format!("{topic}.order.captured"),
    )
    .await;
    let report = subscription
        .drain(&strict, Duration::from_millis(500))
        .await
        .unwrap();
    assert_eq!(report.quarantined, 1, "{report:?}");
    let quarantined = strict.quarantined(10).await.unwrap();
    assert_eq!(
        quarantined[0].event_type.as_deref(),
        Some("PAYMENT_CAPTURED")
    );
    assert!(
        quarantined[0]
            .reason
            .contains("no handler for event type PAYMENT_CAPTURED"),
        "{}",
        quarantined[0].reason
    );
    publisher.jetstream().delete_stream(&stream).await.unwrap();
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_consumer_takes_three_event_types_from_one_rabbitmq_queue() {
    let url = amqp_url();
    let Some(publisher) = reachable("RabbitMQ", &url, RabbitMqPublisher::connect(&url).await)
    else {
        return;
    };
    let db = TestDb::sqlite().await.unwrap();
    let pool = db.pool().clone();
    prepare(&pool).await;
    let exchange = unique("shop").replace('_', "-");
    publisher.declare_exchange(&exchange).await.unwrap();
    let queue = format!("{exchange}-view");
    let subscription = RabbitMqSubscription::bind(&publisher, &exchange, &queue, "order.*")
        .await
        .unwrap();
    let outbox = order_service(&pool, &exchange).await;
    let relay = outbox.relay(publisher, RelayConfig::new("relay"));
    assert_eq!(relay.drain().await.unwrap().published, ORDERS * 3 + 1);

    let view = order_view!(&pool, UnknownEvents::Ignore);
    let report = subscription
        .drain(&view, Duration::from_millis(500))
        .await
        .unwrap();
    assert_eq!(
        (report.applied, report.ignored),
        (ORDERS * 3, 1),
        "{report:?}"
    );
    assert_every_event_in_order(&pool).await;

    // The same body again is a duplicate for the view: the router runs behind the inbox.
    let body = serde_json::to_vec(
        &outbox
            .by_event_no("ORDER_PAID:o-00")
            .await
            .unwrap()
            .unwrap()
            .envelope()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        view.receive(&body, None).await.unwrap(),
        Processed::Duplicate
    );
    let cleanup = RabbitMqPublisher::connect(&url).await.unwrap();
    cleanup
        .channel()
        .queue_delete(
            lapin::types::ShortString::from(queue.as_str()),
            lapin::options::QueueDeleteOptions::default(),
        )
        .await
        .unwrap();
    db.cleanup().await;
}

/// A consumer runs in a background task, as a service runs it, until it is told to stop: the
/// subscription's future can be spawned, and what it applied is reported on shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_runs_in_a_spawned_task_until_shutdown() {
    let Some((publisher, db, topic, stream)) = shop_on_jetstream().await else {
        return;
    };
    let pool = db.pool().clone();
    let subscription = durable(&publisher, &stream, "order-view", &format!("{topic}.>")).await;
    let view = order_view!(&pool, UnknownEvents::Ignore);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        subscription
            .run(&view, async {
                let _ = stopped.await;
            })
            .await
    });

    let outbox = order_service(&pool, &topic).await;
    outbox
        .relay(publisher.clone(), RelayConfig::new("relay"))
        .drain()
        .await
        .unwrap();
    event_tests::wait::until(Duration::from_secs(30), async || {
        let seen: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM seen")
            .fetch_one(&pool)
            .await
            .unwrap();
        if seen == (ORDERS * 3) as i64 {
            Ok(())
        } else {
            Err(format!("the running consumer applied {seen}"))
        }
    })
    .await;
    let _ = stop.send(());
    let report = running.await.unwrap().unwrap();
    assert_eq!(
        (report.applied, report.ignored),
        (ORDERS * 3, 1),
        "{report:?}"
    );
    assert_every_event_in_order(&pool).await;
    publisher.jetstream().delete_stream(&stream).await.unwrap();
    db.cleanup().await;
}
