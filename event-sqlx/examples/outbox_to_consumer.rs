//! An order service and a billing consumer in one process, on SQLite in memory: each order and
//! its events commit in one transaction, the relay publishes them into a channel, and the
//! consumer applies each once (the second delivery of the same event is a duplicate).
//!
//! `cargo run -p event-sqlx --example outbox_to_consumer`

mod shop;

use event_sqlx::{ChannelPublisher, Processed, RelayConfig};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (pool, outbox) = shop::database().await?;
    let run = shop::run_id();
    shop::place_orders(&pool, &outbox, &run, 2).await?;

    // The relay: every committed event into a channel.
    let (publisher, mut messages) = ChannelPublisher::channel(100);
    let relay = outbox.relay(publisher, RelayConfig::new("example-relay"));
    println!("relayed {} events", relay.drain().await?.published);

    // The billing consumer gets every message twice, as a broker may deliver it: one effect.
    let billing = shop::billing(pool.clone());
    let mut consumed = event_sqlx::ConsumeReport::default();
    while let Ok(message) = messages.try_recv() {
        let body = serde_json::to_vec(&message.envelope)?;
        let first = billing.receive(&body, None).await?;
        let again = billing.receive(&body, None).await?;
        println!("{}: {first:?}, then {again:?}", message.envelope.event_id);
        consumed.applied += usize::from(first == Processed::Applied);
        consumed.duplicates += usize::from(again == Processed::Duplicate);
    }
    shop::report(&pool, &run, 2, consumed).await
}
