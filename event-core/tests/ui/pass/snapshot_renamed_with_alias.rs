use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

/// `amount` renamed to `total`, reading the old name too: stored events still read.
#[derive(Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(event_type = "SNAP_ALIASED", snapshots = "../snapshots")]
struct OrderPaid {
    order_id: String,
    #[serde(alias = "amount")]
    total: i64,
}

fn main() {}
