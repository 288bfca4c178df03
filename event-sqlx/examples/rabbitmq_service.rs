//! An order service, its relay and a billing consumer over RabbitMQ: the relay publishes with
//! confirms to the topic exchange `order.event`, the consumer reads the queue `billing` bound to
//! `order.*`, and bills each paid order once.
//!
//! Start RabbitMQ, then `cargo run -p event-sqlx --features rabbitmq --example rabbitmq_service`
//! (`AMQP_URL` overrides `amqp://guest:guest@127.0.0.1:5672/%2f`).

mod shop;

use std::time::Duration;

use event_sqlx::{RabbitMqPublisher, RabbitMqSubscription, RelayConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    let (pool, outbox) = shop::database().await?;
    let run = shop::run_id();
    shop::place_orders(&pool, &outbox, &run, 3).await?;

    // The queue is bound before the relay publishes: a message no queue receives is refused
    // (published `mandatory`) and retried, never dropped.
    let rabbit = RabbitMqPublisher::connect(&url).await?;
    rabbit.declare_exchange("order.event").await?;
    let subscription =
        RabbitMqSubscription::bind(&rabbit, "order.event", "billing", "order.*").await?;
    let relay = outbox.relay(rabbit.clone(), RelayConfig::new("relay-1"));
    println!("relay: {} events published", relay.drain().await?.published);

    let consumer = shop::billing(pool.clone());
    let consumed = subscription
        .drain(&consumer, Duration::from_secs(1))
        .await?;
    shop::report(&pool, &run, 3, consumed).await
}
