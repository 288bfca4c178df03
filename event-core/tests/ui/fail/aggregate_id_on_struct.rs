use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(aggregate_id)]
struct OrderPaid {
    order_id: String,
}

fn main() {}
