//! An order service, its relay and a billing consumer over NATS JetStream: the orders and their
//! events commit in one transaction each, the relay publishes them to the stream `ORDERS`, and
//! the consumer bills each paid order once.
//!
//! Start a server with JetStream (`nats-server -js`), then
//! `cargo run -p event-sqlx --features nats --example nats_service`
//! (`NATS_URL` overrides `nats://127.0.0.1:4222`).

mod shop;

use std::time::Duration;

use event_sqlx::{JetStreamSubscription, NatsPublisher, RelayConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
    let (pool, outbox) = shop::database().await?;
    let run = shop::run_id();
    shop::place_orders(&pool, &outbox, &run, 3).await?;

    // Every order event goes to `order.event.<type>`, one stream for all of them.
    let nats = NatsPublisher::connect(&url).await?;
    nats.ensure_stream("ORDERS", vec!["order.event.>".into()])
        .await?;
    let relay = outbox.relay(nats.clone(), RelayConfig::new("relay-1"));
    println!("relay: {} events published", relay.drain().await?.published);

    let subscription = JetStreamSubscription::durable(
        &nats,
        "ORDERS",
        "billing",
        "order.event.>",
        Duration::from_secs(30),
    )
    .await?;
    let consumer = shop::billing(pool.clone());
    let consumed = subscription
        .drain(&consumer, Duration::from_secs(1))
        .await?;
    shop::report(&pool, &run, 3, consumed).await
}
