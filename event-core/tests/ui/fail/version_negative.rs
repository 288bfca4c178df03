use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(version = -2)]
struct OrderPaid {
    order_id: String,
}

fn main() {}
