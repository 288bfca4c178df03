//! The harness over the real outbox, relay and consumers: cascades that settle, errors that say
//! what is stuck, time the test moves, faults it injects, one body on SQLite and PostgreSQL.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use event_core::{Aggregate, DomainEvent, EventContext, EventEnvelope, RecordedEvents, UnitOfWork};
use event_sqlx::{
    Backend, Backoff, Clock, Consumer, Delivered, EventStatus, HandlerError, Outbox, OutboxConfig,
    Processed,
};
use event_test::{Expected, Flaky, Harness, Stop};
use serde_json::json;
use sqlx::{Sqlite, SqliteConnection};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(aggregate = "ORDER")]
struct OrderPlaced {
    #[domain_event(aggregate_id)]
    order_id: String,
    amount_minor: i64,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(aggregate = "INVOICE")]
struct InvoiceIssued {
    #[domain_event(aggregate_id)]
    invoice_id: String,
    amount_minor: i64,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(aggregate = "NOTICE")]
struct CustomerNotified {
    #[domain_event(aggregate_id)]
    notice_id: String,
}

/// Any aggregate of the test: its type is a const, so one struct per type.
macro_rules! aggregate {
    ($name:ident, $type:literal) => {
        struct $name {
            id: String,
            events: RecordedEvents,
        }
        impl Aggregate for $name {
            const AGGREGATE_TYPE: &'static str = $type;
            fn aggregate_id(&self) -> String {
                self.id.clone()
            }
            fn recorded_events(&mut self) -> &mut RecordedEvents {
                &mut self.events
            }
        }
    };
}
aggregate!(Order, "ORDER");
aggregate!(Invoice, "INVOICE");
aggregate!(Notice, "NOTICE");

/// What the service does on a command: the events in the outbox in one transaction.
async fn place_orders<DB: Backend>(h: &Harness<DB>, from: usize, n: usize) {
    let mut uow = UnitOfWork::new(h.context("order-service"));
    for i in from..from + n {
        let mut order = Order {
            id: format!("o-{i}"),
            events: RecordedEvents::new(),
        };
        order
            .record(OrderPlaced {
                order_id: order.id.clone(),
                amount_minor: i as i64,
            })
            .unwrap();
        uow.collect(&mut order).unwrap();
    }
    let tx = h.pool().begin().await.unwrap();
    let _ = h.outbox().commit(tx, uow).await.unwrap();
}

/// Records `event` on `aggregate` and flushes it in the handler's transaction: a cascade.
async fn cascade<DB: Backend, A: Aggregate, E: DomainEvent>(
    outbox: &Outbox<DB>,
    tx: &mut DB::Connection,
    cause: &EventEnvelope,
    source: &str,
    mut aggregate: A,
    event: E,
) -> Result<(), HandlerError> {
    aggregate.record(event)?;
    let mut uow = UnitOfWork::new(EventContext::caused_by(source, cause));
    uow.collect(&mut aggregate)?;
    outbox.flush(tx, &uow.commit()).await?;
    Ok(())
}

/// Three consumers: billing issues an invoice per order, the notifier a notice per invoice, the
/// CRM records the notices. Only the toolkit writes, so the body runs on any database.
fn cascade_of_three<DB: Backend>(h: &mut Harness<DB>) {
    let outbox = h.outbox().clone();
    let billing = Consumer::new(h.pool().clone(), "billing", "1").on(
        async move |tx: &mut DB::Connection, placed: Delivered<OrderPlaced>| {
            let invoice = Invoice {
                id: format!("inv-{}", placed.order_id),
                events: RecordedEvents::new(),
            };
            let event = InvoiceIssued {
                invoice_id: invoice.id.clone(),
                amount_minor: placed.amount_minor,
            };
            cascade(&outbox, tx, &placed.envelope, "billing", invoice, event).await
        },
    );
    let outbox = h.outbox().clone();
    let notifier = Consumer::new(h.pool().clone(), "notifier", "1").on(
        async move |tx: &mut DB::Connection, issued: Delivered<InvoiceIssued>| {
            let notice = Notice {
                id: format!("n-{}", issued.invoice_id),
                events: RecordedEvents::new(),
            };
            let event = CustomerNotified {
                notice_id: notice.id.clone(),
            };
            cascade(&outbox, tx, &issued.envelope, "notifier", notice, event).await
        },
    );
    let crm = Consumer::new(h.pool().clone(), "crm", "1")
        .on(async |_tx: &mut DB::Connection, _n: Delivered<CustomerNotified>| Ok(()));
    h.consumer(billing).consumer(notifier).consumer(crm);
}

/// The body both databases run: a cascade of three consumers over `orders` orders, with a
/// duplicate delivery and a relay crash between publish and mark on the way.
async fn cascade_settles_with_faults<DB: Backend>(
    mut h: Harness<DB>,
    orders: usize,
) -> Harness<DB> {
    cascade_of_three(&mut h);
    h.broker()
        .duplicate_next(1)
        .crash_relay_after_next_publish();
    place_orders(&h, 0, orders).await;

    // The crashed relay's batch stays leased until its lease ends.
    let stuck = h.settle().await.unwrap_err();
    assert_eq!(stuck.stop, Stop::Idle, "{stuck}");
    assert!(!stuck.rows.is_empty(), "{stuck}");
    assert!(
        stuck
            .rows
            .iter()
            .all(|r| r.publish_status == EventStatus::InProgress
                && r.locked_by.as_deref() == Some("test-relay-1")),
        "{stuck}"
    );
    assert!(
        stuck.to_string().contains("leased by test-relay-1"),
        "{stuck}"
    );

    // Time passes: the lease expires, is recovered, and the events go out again.
    let settled = h.run_for(Duration::from_secs(60)).await.unwrap();
    assert_eq!(settled.relay_crashes, 0);
    for consumer in ["billing", "notifier", "crm"] {
        assert_eq!(h.applied(consumer).len(), orders, "{consumer}");
    }
    // Every order's invoice and notice exactly once, and caused by it.
    let invoices: Vec<EventEnvelope> = h.applied("notifier");
    let mut ids: Vec<&str> = invoices.iter().map(|e| e.aggregate_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), orders);
    let first = h.applied("billing")[0].clone();
    let invoice = invoices
        .iter()
        .find(|e| e.aggregate_id == format!("inv-{}", first.aggregate_id))
        .unwrap();
    assert_eq!(
        invoice.headers.causation_id.as_deref(),
        Some(first.event_id.as_str())
    );
    // The republished batch and the duplicate reached the consumers, and did nothing.
    let duplicates = h
        .received("billing")
        .iter()
        .filter(|(_, p)| *p == Processed::Duplicate)
        .count();
    assert!(duplicates >= 2, "{duplicates}");
    assert_eq!(h.broker().faults_left(), 0);
    h
}

#[tokio::test]
async fn a_cascade_of_three_consumers_over_1000_events_settles_on_sqlite_in_memory() {
    let h = Harness::new().await.unwrap();
    cascade_settles_with_faults(h, 1000).await;
}

#[tokio::test]
async fn the_same_body_settles_on_postgresql() {
    let Some((pool, drop_it)) = fresh_postgres().await else {
        return;
    };
    let h = Harness::with_pool(pool, OutboxConfig::new()).await.unwrap();
    let h = cascade_settles_with_faults(h, 300).await;
    h.pool().close().await;
    drop_it.await;
}

/// A fresh PostgreSQL database and what drops it, or `None` when the server is unreachable and
/// not required.
async fn fresh_postgres() -> Option<(sqlx::PgPool, impl Future<Output = ()>)> {
    let url = std::env::var("EVENT_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let admin = match sqlx::PgPool::connect(&url).await {
        Ok(pool) => pool,
        Err(e) => {
            assert!(
                std::env::var("EVENT_TEST_REQUIRE_SERVICES").as_deref() != Ok("1"),
                "PostgreSQL at {url} is unreachable ({e}); EVENT_TEST_REQUIRE_SERVICES=1 makes this a failure"
            );
            eprintln!("skipping: PostgreSQL at {url} is unreachable ({e})");
            return None;
        }
    };
    let name = format!(
        "event_test_{}_{}",
        std::process::id(),
        chrono::Utc::now().timestamp_micros()
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&admin)
        .await
        .unwrap();
    let (base, _) = url.rsplit_once('/').unwrap();
    let pool = sqlx::PgPool::connect(&format!("{base}/{name}"))
        .await
        .unwrap();
    let drop_it = async move {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
        )))
        .execute(&admin)
        .await
        .unwrap();
    };
    Some((pool, drop_it))
}

// The tests below use an effect table of the service's own, on SQLite in memory.

async fn billing_harness() -> Harness<Sqlite> {
    let h = Harness::new().await.unwrap();
    sqlx::query("CREATE TABLE bill (order_id TEXT NOT NULL, amount INTEGER NOT NULL)")
        .execute(h.pool())
        .await
        .unwrap();
    h
}

async fn on_placed(
    tx: &mut SqliteConnection,
    placed: Delivered<OrderPlaced>,
) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO bill (order_id, amount) VALUES (?, ?)")
        .bind(&placed.order_id)
        .bind(placed.amount_minor)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

async fn bills(h: &Harness<Sqlite>) -> Vec<(String, i64)> {
    sqlx::query_as("SELECT order_id, COUNT(*) FROM bill GROUP BY order_id ORDER BY order_id")
        .fetch_all(h.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn settle_names_what_is_stuck_when_a_handler_always_fails_transiently() {
    let mut h = billing_harness().await;
    let flaky = Flaky::transient(u32::MAX);
    h.consumer(
        Consumer::new(h.pool().clone(), "billing", "1")
            .transient_retries(u32::MAX, Backoff::schedule([Duration::from_secs(1)]))
            .on(flaky.wrap(on_placed)),
    );
    h.deadline(Duration::from_millis(300));
    place_orders(&h, 0, 1).await;
    let stuck = h.settle().await.unwrap_err();
    assert_eq!(stuck.stop, Stop::Deadline(Duration::from_millis(300)));
    let text = stuck.to_string();
    assert!(
        text.contains(
            "running when it stopped: consumer billing handling ORDER_PLACED:ORDER:o-0:1"
        ),
        "{text}"
    );
    assert!(
        text.contains("to billing: ORDER_PLACED:ORDER:o-0:1"),
        "{text}"
    );
    assert_eq!(stuck.undelivered.len(), 1);
    assert!(flaky.calls() > 3, "{}", flaky.calls());
    assert!(bills(&h).await.is_empty());
}

#[tokio::test]
async fn a_rejected_event_goes_through_its_whole_backoff_schedule_to_failed() {
    let config = OutboxConfig::new().max_retry_count(3);
    let mut h = Harness::with_pool(event_test::memory_database().await.unwrap(), config)
        .await
        .unwrap();
    let backoff = Backoff::schedule([
        Duration::from_secs(1),
        Duration::from_secs(10),
        Duration::from_secs(100),
    ])
    .jitter(0.0);
    h.relay_config(move |c| c.backoff(backoff.clone()));
    h.broker().reject_next(1000);
    let start = h.clock().now();
    let real = std::time::Instant::now();
    place_orders(&h, 0, 1).await;

    // Nothing more happens now: the retry is a second away.
    let waiting = h.settle().await.unwrap_err();
    assert_eq!(waiting.stop, Stop::Idle);
    assert_eq!(waiting.rows[0].retry_count, 1);
    assert_eq!(
        waiting.next_due(),
        Some(start + chrono::TimeDelta::seconds(1))
    );
    assert!(
        waiting.to_string().contains("refused by the test broker"),
        "{waiting}"
    );

    // Letting time pass runs the rest of the schedule, to failed at the last retry.
    h.run_for(Duration::from_secs(3600)).await.unwrap();
    let row = h
        .outbox()
        .by_event_no("ORDER_PLACED:ORDER:o-0:1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.publish_status, EventStatus::Failed);
    assert_eq!(row.retry_count, 3);
    assert_eq!((h.clock().now() - start).num_seconds(), 1 + 10);
    assert!(real.elapsed() < Duration::from_secs(10));
    assert!(h.published().is_empty());
}

#[tokio::test]
async fn a_relay_crash_between_publish_and_mark_is_recovered_after_its_lease_with_one_effect() {
    let mut h = billing_harness().await;
    h.consumer(Consumer::new(h.pool().clone(), "billing", "1").on(on_placed));
    h.broker().crash_relay_after_next_publish();
    place_orders(&h, 0, 1).await;

    let leased = h.settle().await.unwrap_err();
    assert_eq!(leased.rows.len(), 1);
    assert_eq!(leased.rows[0].locked_by.as_deref(), Some("test-relay-1"));
    assert_eq!(leased.progress.relay_crashes, 1);

    // The default lease is 15 s: past it, the next relay recovers the event, due 5 s later.
    h.advance(Duration::from_secs(16));
    let recovered = h.settle().await.unwrap_err();
    assert_eq!(recovered.rows[0].publish_status, EventStatus::Failed);
    assert!(
        recovered.to_string().contains("relay lease expired"),
        "{recovered}"
    );
    h.advance(Duration::from_secs(5));
    h.settle().await.unwrap();

    assert_eq!(h.published().len(), 2);
    let outcomes: Vec<&Processed> = h.received("billing").iter().map(|(_, p)| p).collect();
    assert_eq!(outcomes, [&Processed::Applied, &Processed::Duplicate]);
    assert_eq!(bills(&h).await, [("o-0".to_owned(), 1)]);
    let row = h
        .outbox()
        .by_event_no("ORDER_PLACED:ORDER:o-0:1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.publish_status, EventStatus::Succeeded);
}

#[tokio::test]
async fn a_message_delivered_twice_has_one_effect() {
    let mut h = billing_harness().await;
    h.consumer(Consumer::new(h.pool().clone(), "billing", "1").on(on_placed));
    h.broker().duplicate_next(1);
    place_orders(&h, 0, 2).await;
    h.settle().await.unwrap();
    assert_eq!(h.received("billing").len(), 3);
    assert_eq!(
        bills(&h).await,
        [("o-0".to_owned(), 1), ("o-1".to_owned(), 1)]
    );
    h.assert_applied(
        "billing",
        [
            Expected::like::<OrderPlaced>(json!({ "order_id": "o-0" })).sequence(1),
            Expected::like::<OrderPlaced>(json!({ "order_id": "o-1" }))
                .header("source", "order-service"),
        ],
    );
}

#[tokio::test]
async fn a_consumer_stopped_mid_batch_applies_each_event_once() {
    let mut h = billing_harness().await;
    h.consumer(Consumer::new(h.pool().clone(), "billing", "1").on(on_placed));
    h.stop_consumer_mid_batch("billing", 2);
    place_orders(&h, 0, 5).await;
    let settled = h.settle().await.unwrap();
    assert_eq!(settled.consumer_stops, 1);
    let duplicates = h
        .received("billing")
        .iter()
        .filter(|(_, p)| *p == Processed::Duplicate)
        .count();
    assert_eq!(duplicates, 2);
    assert_eq!(bills(&h).await.len(), 5);
    assert!(bills(&h).await.iter().all(|(_, n)| *n == 1));
}

#[tokio::test]
async fn a_handler_failing_twice_is_retried_and_applies_once() {
    let mut h = billing_harness().await;
    let flaky = Flaky::transient(2);
    h.consumer(Consumer::new(h.pool().clone(), "billing", "1").on(flaky.wrap(on_placed)));
    let start = h.clock().now();
    place_orders(&h, 0, 1).await;
    h.settle().await.unwrap();
    assert_eq!(flaky.calls(), 3);
    assert_eq!(bills(&h).await.len(), 1);
    // The consumer's pauses (100 ms, then 1 s, ±10%) moved the harness clock.
    let moved = (h.clock().now() - start).num_milliseconds();
    assert!((990..=1210).contains(&moved), "{moved}");
}

#[tokio::test]
async fn an_outage_gives_the_batch_back_without_counting_an_attempt() {
    let mut h = billing_harness().await;
    h.consumer(Consumer::new(h.pool().clone(), "billing", "1").on(on_placed));
    h.broker().unavailable_next(3);
    place_orders(&h, 0, 3).await;
    h.settle().await.unwrap();
    let row = h
        .outbox()
        .by_event_no("ORDER_PLACED:ORDER:o-0:1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.retry_count, 0);
    assert_eq!(row.publish_status, EventStatus::Succeeded);
    assert_eq!(bills(&h).await.len(), 3);
}

#[tokio::test]
async fn two_harnesses_do_not_see_each_others_events() {
    let mut a = billing_harness().await;
    let mut b = billing_harness().await;
    a.consumer(Consumer::new(a.pool().clone(), "billing", "1").on(on_placed));
    b.consumer(Consumer::new(b.pool().clone(), "billing", "1").on(on_placed));
    place_orders(&a, 0, 2).await;
    a.settle().await.unwrap();
    b.settle().await.unwrap();
    assert_eq!(a.published().len(), 2);
    assert!(b.published().is_empty());
    assert!(b.received("billing").is_empty());
    assert!(bills(&b).await.is_empty());
}

#[tokio::test]
async fn retention_archives_what_the_clock_aged() {
    let mut h = billing_harness().await;
    h.consumer(Consumer::new(h.pool().clone(), "billing", "1").on(on_placed));
    place_orders(&h, 0, 3).await;
    h.settle().await.unwrap();
    let week = Duration::from_secs(7 * 24 * 3600);
    assert_eq!(h.outbox().archivable(week).await.unwrap(), 0);
    h.advance(week + Duration::from_secs(1));
    assert_eq!(h.outbox().archivable(week).await.unwrap(), 3);
    let report = h.outbox().archive(week, 100, |_| {}).await.unwrap();
    assert_eq!(report.moved, 3);
}

#[tokio::test]
async fn the_step_budget_stops_events_that_cause_themselves_without_end() {
    let mut h = Harness::new().await.unwrap();
    let outbox = h.outbox().clone();
    h.consumer(Consumer::new(h.pool().clone(), "echo", "1").on(
        async move |tx: &mut SqliteConnection, placed: Delivered<OrderPlaced>| {
            // Every order places the next one.
            let n: usize = placed.order_id[2..].parse().unwrap_or(0) + 1;
            let order = Order {
                id: format!("o-{n}"),
                events: RecordedEvents::new(),
            };
            let event = OrderPlaced {
                order_id: order.id.clone(),
                amount_minor: 0,
            };
            cascade(&outbox, tx, &placed.envelope, "echo", order, event).await
        },
    ));
    h.step_budget(50);
    place_orders(&h, 0, 1).await;
    let endless = h.settle().await.unwrap_err();
    assert_eq!(endless.stop, Stop::Budget(50));
    assert!(
        endless
            .to_string()
            .contains("do handlers cause events without end"),
        "{endless}"
    );
}

#[tokio::test(start_paused = true)]
async fn under_tokios_paused_time_the_harness_says_how_to_move_time_instead() {
    // Paused time fires sqlx's own timeouts while SQLite works on its thread: refused, with
    // the fix, instead of a pool timeout.
    let error = Harness::new().await.err().expect("refused");
    let text = error.to_string();
    assert!(text.contains("start_paused"), "{text}");
    assert!(text.contains("Harness::advance"), "{text}");
}
