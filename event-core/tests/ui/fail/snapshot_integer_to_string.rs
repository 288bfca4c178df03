use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(event_type = "SNAP_INT_TO_STRING", snapshots = "../snapshots")]
struct OrderPaid {
    order_id: String,
    amount: String,
}

fn main() {}
