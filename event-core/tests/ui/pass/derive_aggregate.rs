use event_core::{Aggregate, DomainEvent, RecordedEvents};

#[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(aggregate = "ORDER")]
struct OrderPlaced {
    #[domain_event(aggregate_id)]
    order_id: u64,
}

#[derive(Aggregate)]
#[aggregate(type = "ORDER")]
struct Order {
    #[aggregate(id)]
    id: u64,
    history: RecordedEvents,
}

#[derive(Aggregate)]
#[aggregate(type = "CART")]
struct Cart<T> {
    #[aggregate(id)]
    id: String,
    #[aggregate(events)]
    pending: event_core::RecordedEvents,
    #[allow(dead_code)]
    lines: Vec<T>,
}

fn main() {
    let mut order = Order { id: 7, history: RecordedEvents::new() };
    assert_eq!(Order::AGGREGATE_TYPE, "ORDER");
    assert_eq!(order.aggregate_id(), "7");
    order.record(OrderPlaced { order_id: 7 }).unwrap();
    assert_eq!(order.history.pending_len(), 1);
    let mut cart = Cart::<u8> { id: "c-1".into(), pending: RecordedEvents::new(), lines: vec![] };
    assert_eq!(<Cart<u8> as Aggregate>::AGGREGATE_TYPE, "CART");
    assert_eq!(cart.recorded_events().pending_len(), 0);
}
