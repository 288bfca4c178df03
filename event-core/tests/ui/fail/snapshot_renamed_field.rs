use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

/// `amount` renamed to `total` without an alias: the old name is gone and the new one is required.
#[derive(Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(event_type = "SNAP_RENAMED", snapshots = "../snapshots")]
struct OrderPaid {
    order_id: String,
    total: i64,
}

fn main() {}
