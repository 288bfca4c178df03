use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(event_type = "ORDER_PAID")]
#[domain_event(event_type = "ORDER_SETTLED")]
struct OrderPaid {
    order_id: String,
}

fn main() {}
