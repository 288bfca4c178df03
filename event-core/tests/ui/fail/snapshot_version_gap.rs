use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

/// Only v1 is recorded; v2 is skipped.
#[derive(Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(event_type = "SNAP_VERSION_GAP", version = 3, snapshots = "../snapshots")]
struct OrderPaid {
    order_id: String,
    amount: i64,
}

fn main() {}
