//! An order service, its relay and a billing consumer over Kafka: the relay publishes with the
//! idempotent producer to the topic `order.event`, keyed by order, and the consumer group
//! `billing` bills each paid order once, committing offsets after its inbox transaction.
//!
//! Start a Kafka broker, then `cargo run -p event-sqlx --features kafka --example kafka_service`
//! (`KAFKA_BOOTSTRAP` overrides `127.0.0.1:9092`).

mod shop;

use std::time::Duration;

use event_sqlx::{KafkaPublisher, KafkaSubscription, RelayConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let bootstrap =
        std::env::var("KAFKA_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".to_owned());
    let (pool, outbox) = shop::database().await?;
    let run = shop::run_id();
    shop::place_orders(&pool, &outbox, &run, 3).await?;

    // Three partitions: each order's events stay in one, in order.
    let kafka = KafkaPublisher::connect(&bootstrap).await?;
    kafka.ensure_topic("order.event", 3).await?;
    let relay = outbox.relay(kafka.clone(), RelayConfig::new("relay-1"));
    println!("relay: {} events published", relay.drain().await?.published);

    // A group of this run's own, which starts at the topic's earliest message; the first join
    // takes seconds, hence the long idle.
    let group = format!("billing-{run}");
    let subscription = KafkaSubscription::subscribe(&bootstrap, &group, &["order.event"]).await?;
    let consumer = shop::billing(pool.clone());
    let consumed = subscription
        .drain(&consumer, Duration::from_secs(10))
        .await?;
    shop::report(&pool, &run, 3, consumed).await
}
