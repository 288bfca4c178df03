use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

/// `amount` was deleted from ORDER v1.
#[derive(Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(event_type = "SNAP_REMOVED", snapshots = "../snapshots")]
struct OrderPaid {
    order_id: String,
}

fn main() {}
