use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(event_type = "", version = 0, colour = "blue", event_no = "X:{missing}")]
struct OrderPaid {
    #[domain_event(aggregate_id)]
    order_id: String,
    #[domain_event(aggregate_id)]
    payment_id: String,
}

fn main() {}
