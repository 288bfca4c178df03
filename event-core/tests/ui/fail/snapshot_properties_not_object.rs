use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

/// A snapshot that is JSON but not a payload schema is named as such, not read as "no properties".
#[derive(Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(event_type = "SNAP_BAD_PROPERTIES", snapshots = "../snapshots")]
struct OrderPaid {
    order_id: String,
}

fn main() {}
