use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

/// `paid` deleted, `amount` now a string, `note` no longer optional, `currency` new and required:
/// every finding at once.
#[derive(Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(event_type = "SNAP_SEVERAL", snapshots = "../snapshots")]
struct OrderPaid {
    order_id: String,
    amount: String,
    note: String,
    currency: String,
}

fn main() {}
