// The runtime crate under another name, as `renamed_events = { package = "event-core" }`.
use renamed_events::DomainEvent;

#[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(crate = "::renamed_events", event_no = "PAID:{order_id}")]
struct OrderPaid {
    order_id: String,
}

fn main() {
    let paid = OrderPaid { order_id: "o".into() };
    assert_eq!(paid.event_no().unwrap().as_str(), "PAID:o");
    assert_eq!(OrderPaid::event_schema().get("x-event-type"), Some(&serde_json::json!("ORDER_PAID")));
}
