use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

/// Snapshots v2 and v3 exist; v1 was never recorded.
#[derive(Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(event_type = "SNAP_VERSION_BELOW", version = 1, snapshots = "../snapshots")]
struct OrderPaid {
    order_id: String,
    amount: i64,
}

fn main() {}
