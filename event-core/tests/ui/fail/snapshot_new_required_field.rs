use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(event_type = "SNAP_NEW_REQUIRED", snapshots = "../snapshots")]
struct OrderPaid {
    order_id: String,
    amount: i64,
    currency: String,
}

fn main() {}
