//! The service's consumer on SQLite in memory: delivered once, twice, in a batch, out of order,
//! failing, quarantined and replayed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use event_core::DomainEvent;
use event_sqlx::{
    Backoff, Clock, Consumer, Delivered, FailureClass, HandlerError, QuarantineFilter,
};
use event_test::{ConsumerTest, Flaky, Outcome, TestClock};
use sqlx::{SqliteConnection, SqlitePool};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(aggregate = "ORDER")]
struct OrderPaid {
    #[domain_event(aggregate_id)]
    order_id: String,
    amount_minor: i64,
}

/// The service's handler: one row per payment.
async fn on_paid(
    tx: &mut SqliteConnection,
    paid: Delivered<OrderPaid>,
) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO payment (order_id, amount) VALUES (?, ?)")
        .bind(&paid.order_id)
        .bind(paid.amount_minor)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// The service's batch handler: one multi-row insert.
async fn on_paid_batch(
    tx: &mut SqliteConnection,
    paid: Vec<Delivered<OrderPaid>>,
) -> Result<(), HandlerError> {
    for p in paid {
        on_paid(tx, p).await?;
    }
    Ok(())
}

async fn database() -> SqlitePool {
    let pool = event_test::memory_database().await.unwrap();
    sqlx::query("CREATE TABLE payment (order_id TEXT NOT NULL, amount INTEGER NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    pool
}

async fn payments(pool: &SqlitePool) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM payment")
        .fetch_one(pool)
        .await
        .unwrap()
}

fn paid(order: &str, sequence: u64) -> event_core::EventEnvelope {
    event_test::envelope(OrderPaid {
        order_id: order.into(),
        amount_minor: 100,
    })
    .sequence(sequence)
    .build()
}

#[tokio::test]
async fn an_envelope_delivered_twice_has_one_effect() {
    let pool = database().await;
    let consumer = Consumer::new(pool.clone(), "billing", "1").on(on_paid);
    let (first, second) = consumer.deliver_twice(&paid("o-1", 1)).await.unwrap();
    assert_eq!(first, Outcome::Applied);
    assert_eq!(second, Outcome::Duplicate);
    assert_eq!(payments(&pool).await, 1);
}

#[tokio::test]
async fn a_batch_goes_to_the_batch_handler_and_duplicates_in_it_count_once() {
    let pool = database().await;
    let consumer = Consumer::new(pool.clone(), "billing", "1").on_batch(on_paid_batch);
    let a = paid("o-1", 1);
    let b = paid("o-2", 1);
    let outcomes = consumer.deliver_batch(&[a.clone(), b, a]).await.unwrap();
    assert_eq!(
        outcomes,
        [Outcome::Applied, Outcome::Applied, Outcome::Duplicate]
    );
    assert_eq!(payments(&pool).await, 2);
}

#[tokio::test]
async fn events_of_other_types_are_ignored_and_garbage_is_quarantined() {
    #[derive(
        Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent,
    )]
    struct OrderShipped {
        order_id: String,
    }
    let pool = database().await;
    let consumer = Consumer::new(pool.clone(), "billing", "1").on(on_paid);
    let shipped = event_test::envelope(OrderShipped {
        order_id: "o-1".into(),
    })
    .build();
    assert_eq!(consumer.deliver(&shipped).await.unwrap(), Outcome::Ignored);
    match consumer.deliver_body(b"{not json").await.unwrap() {
        Outcome::Quarantined { class, reason } => {
            assert_eq!(class, FailureClass::Permanent);
            assert!(reason.contains("not an event envelope"), "{reason}");
        }
        other => panic!("expected a quarantine, got {other:?}"),
    }
    // A payload its type cannot read is permanent too.
    let bad = event_test::envelope(OrderPaid {
        order_id: "o-1".into(),
        amount_minor: 1,
    })
    .payload(serde_json::json!({ "order_id": "o-1", "amount_minor": "a lot" }))
    .build();
    assert!(matches!(
        consumer.deliver(&bad).await.unwrap(),
        Outcome::Quarantined {
            class: FailureClass::Permanent,
            ..
        }
    ));
    assert_eq!(payments(&pool).await, 0);
}

#[tokio::test]
async fn a_transient_failure_is_retried_on_the_test_clock_without_waiting() {
    let pool = database().await;
    let clock = TestClock::new();
    let start = clock.now();
    let flaky = Flaky::transient(2);
    let consumer = Consumer::new(pool.clone(), "billing", "1")
        .clock(clock.clone())
        .transient_retries(
            3,
            Backoff::schedule([Duration::from_secs(10), Duration::from_secs(60)]).jitter(0.0),
        )
        .on(flaky.wrap(on_paid));
    let real = std::time::Instant::now();
    assert_eq!(
        consumer.deliver(&paid("o-1", 1)).await.unwrap(),
        Outcome::Applied
    );
    assert_eq!(flaky.calls(), 3);
    // The two pauses moved the test clock, not the wall clock.
    assert_eq!((clock.now() - start).num_seconds(), 70);
    assert!(real.elapsed() < Duration::from_secs(10));
    assert_eq!(payments(&pool).await, 1);
}

#[tokio::test]
async fn a_handler_failing_past_its_retries_is_quarantined_then_replayed_after_the_fix() {
    let pool = database().await;
    let flaky = Flaky::transient(u32::MAX);
    let consumer = Consumer::new(pool.clone(), "billing", "1")
        .clock(TestClock::new())
        .on(flaky.wrap(on_paid));
    let event = paid("o-1", 1);
    match consumer.deliver(&event).await.unwrap() {
        Outcome::Quarantined { class, reason } => {
            assert_eq!(class, FailureClass::Transient);
            assert!(
                reason.contains("still failing after 3 attempts"),
                "{reason}"
            );
        }
        other => panic!("expected a quarantine, got {other:?}"),
    }
    assert_eq!(payments(&pool).await, 0);

    // The fix: the dependency is back.
    flaky.fail_next(0);
    let replayed = consumer
        .replay_quarantined(&QuarantineFilter::default().event_id(event.event_id.as_str()))
        .await
        .unwrap();
    assert_eq!(replayed, 1);
    assert_eq!(payments(&pool).await, 1);
    // Replayed once: delivered again, it is a duplicate.
    assert_eq!(consumer.deliver(&event).await.unwrap(), Outcome::Duplicate);
    assert_eq!(payments(&pool).await, 1);
}

#[tokio::test]
async fn a_permanent_failure_is_quarantined_at_once() {
    let pool = database().await;
    let flaky = Flaky::permanent(1);
    let consumer = Consumer::new(pool.clone(), "billing", "1").on(flaky.wrap(on_paid));
    assert!(matches!(
        consumer.deliver(&paid("o-1", 1)).await.unwrap(),
        Outcome::Quarantined {
            class: FailureClass::Permanent,
            ..
        }
    ));
    assert_eq!(flaky.calls(), 1);
}

#[tokio::test]
async fn a_bug_stops_the_consumer() {
    let pool = database().await;
    let flaky = Flaky::failing(1, HandlerError::Bug("divided by zero".into()));
    let consumer = Consumer::new(pool.clone(), "billing", "1").on(flaky.wrap(on_paid));
    let error = consumer.deliver(&paid("o-1", 1)).await.unwrap_err();
    assert!(error.to_string().contains("billing"), "{error}");
    // Not recorded: delivered again after the fix, it applies.
    assert_eq!(
        consumer.deliver(&paid("o-1", 1)).await.unwrap(),
        Outcome::Applied
    );
}

#[tokio::test]
async fn out_of_order_with_reject_stale_and_in_order() {
    let pool = database().await;
    let stale = Consumer::new(pool.clone(), "stale-billing", "1")
        .reject_stale()
        .on(on_paid);
    assert_eq!(
        stale.deliver(&paid("o-1", 2)).await.unwrap(),
        Outcome::Applied
    );
    assert_eq!(
        stale.deliver(&paid("o-1", 1)).await.unwrap(),
        Outcome::Stale
    );
    assert_eq!(payments(&pool).await, 1);

    let ordered = Consumer::new(pool.clone(), "ordered-billing", "1")
        .in_order()
        .on(on_paid);
    assert_eq!(
        ordered.deliver(&paid("o-2", 2)).await.unwrap(),
        Outcome::Early { waits_for: 1 }
    );
    assert_eq!(
        ordered.deliver(&paid("o-2", 1)).await.unwrap(),
        Outcome::Applied
    );
    assert_eq!(
        ordered.deliver(&paid("o-2", 2)).await.unwrap(),
        Outcome::Applied
    );
    assert_eq!(payments(&pool).await, 3);
}

#[tokio::test]
async fn two_memory_databases_are_two_databases() {
    let a = database().await;
    let b = database().await;
    sqlx::query("INSERT INTO payment VALUES ('o-1', 1)")
        .execute(&a)
        .await
        .unwrap();
    assert_eq!(payments(&a).await, 1);
    assert_eq!(payments(&b).await, 0);
    // Every connection of one pool sees the same database.
    let mut conns = Vec::new();
    for _ in 0..4 {
        conns.push(a.acquire().await.unwrap());
    }
    for conn in &mut conns {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM payment")
            .fetch_one(&mut **conn)
            .await
            .unwrap();
        assert_eq!(n, 1);
    }
}
