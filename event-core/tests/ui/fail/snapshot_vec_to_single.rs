use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(event_type = "SNAP_VEC_TO_ONE", snapshots = "../snapshots")]
struct OrderPaid {
    order_id: String,
    lines: String,
}

fn main() {}
