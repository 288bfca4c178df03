use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(event_type = "SNAP_NOT_JSON", snapshots = "../snapshots")]
struct OrderPaid {
    order_id: String,
}

fn main() {}
