use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(event_no = "ORDER_PAID:{orderid}")]
struct OrderPaid {
    order_id: String,
    amount_minor: i64,
}

fn main() {}
