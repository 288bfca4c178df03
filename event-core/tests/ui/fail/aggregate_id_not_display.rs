use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct OrderId {
    value: u64,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
struct OrderPaid {
    #[domain_event(aggregate_id)]
    order_id: OrderId,
}

fn main() {}
