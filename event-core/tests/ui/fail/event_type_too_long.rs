use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(event_type = "ORDER_PAID_AND_THEN_SOME_MORE_WORDS_UNTIL_THE_NAME_IS_FAR_TOO_LONG_TO_STORE")]
struct OrderPaid {
    order_id: String,
}

fn main() {}
