use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Money {
    minor: i64,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(event_no = "ORDER_PAID:{order_id}:{amount}")]
struct OrderPaid {
    order_id: String,
    amount: Money,
}

fn main() {}
