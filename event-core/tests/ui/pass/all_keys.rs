use event_core::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(event_type = "ORDER_PAID", version = 2, aggregate = "ORDER", event_no = "ORDER_PAID:{order_id}:{{{amount_minor}}}")]
pub struct OrderPaid {
    #[domain_event(aggregate_id)]
    pub order_id: u64,
    pub amount_minor: i64,
    pub currency: String,
}

fn main() {
    let paid = OrderPaid { order_id: 7, amount_minor: -5, currency: "EUR".into() };
    assert_eq!(OrderPaid::EVENT_TYPE, "ORDER_PAID");
    assert_eq!(OrderPaid::EVENT_VERSION, 2);
    assert_eq!(OrderPaid::AGGREGATE_TYPE, Some("ORDER"));
    assert_eq!(paid.aggregate_id().as_deref(), Some("7"));
    assert_eq!(paid.event_no().map(|n| n.into_string()).as_deref(), Some("ORDER_PAID:7:{-5}"));
}
