use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

/// The same shape as its snapshot, through camelCase names, a float read as a number, a Vec, an
/// Option, and fields the check cannot judge (a named type, a skipped field).
#[derive(Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
#[serde(rename_all = "camelCase")]
#[domain_event(event_type = "SNAP_UNCHANGED", snapshots = "../snapshots")]
struct OrderPaid {
    order_id: String,
    amount: f64,
    tags: Vec<String>,
    note: Option<String>,
    #[serde(skip)]
    cache: u32,
}

fn main() {}
