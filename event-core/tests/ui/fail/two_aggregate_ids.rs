use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
struct OrderPaid {
    #[domain_event(aggregate_id)]
    order_id: String,
    #[domain_event(aggregate_id)]
    payment_id: String,
}

fn main() {}
