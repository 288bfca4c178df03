use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

/// New fields that stored events can do without: an Option, and one with a default.
#[derive(Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(event_type = "SNAP_NEW_OPTIONAL", snapshots = "../snapshots")]
struct OrderPaid {
    order_id: String,
    amount: i64,
    currency: Option<String>,
    #[serde(default)]
    gift: bool,
}

fn main() {}
