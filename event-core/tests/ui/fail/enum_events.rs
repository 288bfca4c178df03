use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
enum OrderEvent {
    Placed { order_id: String },
    Paid { order_id: String, amount_minor: i64 },
}

fn main() {}
