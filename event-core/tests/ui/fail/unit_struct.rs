use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
struct OrderPaid;

fn main() {}
