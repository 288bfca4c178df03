//! A batched consumer as its own process, for the tests that kill one mid-batch: it consumes
//! `ORDER_PLACED` events from one broker into PostgreSQL, recording each applied event in the
//! table `applied` (no unique key, so an event applied twice would show twice).
//!
//! Configured by the environment: `BROKER` (nats, rabbitmq, kafka), `TOPIC`, `DATABASE_URL`,
//! `GROUP` (durable, queue or consumer group), `BATCH`, and `HANG_AFTER=N`/`MARKER=PATH`: after
//! its Nth handler call the process writes MARKER and hangs inside the open batch transaction,
//! waiting to be killed.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use event_sqlx::{
    Consumer, Delivered, JetStreamSubscription, KafkaSubscription, NatsPublisher,
    RabbitMqPublisher, RabbitMqSubscription,
};
use event_tests::fixtures::OrderPlaced;
use sqlx::PgConnection;

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}

#[tokio::main]
async fn main() {
    let pool = sqlx::PgPool::connect(&var("DATABASE_URL")).await.unwrap();
    let batch: usize = var("BATCH").parse().unwrap();
    let hang_after: Option<usize> = std::env::var("HANG_AFTER").ok().map(|n| n.parse().unwrap());
    let calls = AtomicUsize::new(0);
    let consumer = Consumer::new(pool, "billing", "1.0.0").on(
        async |tx: &mut PgConnection, placed: Delivered<OrderPlaced>| {
            sqlx::query(
                "INSERT INTO applied (aggregate_id, sequence, event_id) VALUES ($1, $2, $3)",
            )
            .bind(&placed.envelope.aggregate_id)
            .bind(placed.envelope.aggregate_sequence as i64)
            .bind(placed.envelope.event_id.as_str())
            .execute(&mut *tx)
            .await?;
            if hang_after == Some(calls.fetch_add(1, Ordering::SeqCst) + 1) {
                std::fs::write(var("MARKER"), b"mid-batch").unwrap();
                std::future::pending::<()>().await;
            }
            Ok(())
        },
    );
    let (topic, group) = (var("TOPIC"), var("GROUP"));
    let forever = std::future::pending::<()>();
    match var("BROKER").as_str() {
        "nats" => {
            let publisher = NatsPublisher::connect(&var("NATS_URL")).await.unwrap();
            let stream = topic.replace('-', "_").to_uppercase();
            let subscription = JetStreamSubscription::durable(
                &publisher,
                &stream,
                &group,
                &format!("{topic}.>"),
                Duration::from_secs(2),
            )
            .await
            .unwrap()
            .batch(batch);
            subscription.run(&consumer, forever).await.unwrap();
        }
        "rabbitmq" => {
            let publisher = RabbitMqPublisher::connect(&var("AMQP_URL")).await.unwrap();
            let subscription = RabbitMqSubscription::bind(&publisher, &topic, &group, "order.*")
                .await
                .unwrap()
                .batch(batch);
            subscription.run(&consumer, forever).await.unwrap();
        }
        "kafka" => {
            let subscription = KafkaSubscription::with_config(
                &var("KAFKA_URL"),
                &group,
                &[topic.as_str()],
                &[("session.timeout.ms", "6000")],
            )
            .await
            .unwrap()
            .batch(batch);
            subscription.run(&consumer, forever).await.unwrap();
        }
        other => panic!("no broker {other}"),
    }
}
