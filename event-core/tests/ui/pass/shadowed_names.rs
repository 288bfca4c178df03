// Generated code must keep working when the user's crate shadows common names.
#![allow(dead_code, non_camel_case_types)]

type Result = ();
type Option = ();
struct String;
struct Some;
struct None;
mod core {}
mod std {}
mod serde {}
mod event_core {}
trait Display {}
trait ToString {}

#[derive(::serde::Serialize, ::serde::Deserialize, ::schemars::JsonSchema, ::event_core::DomainEvent)]
#[domain_event(aggregate = "ORDER", event_no = "ORDER_PAID:{order_id}")]
struct OrderPaid {
    #[domain_event(aggregate_id)]
    order_id: u64,
}

fn main() {
    use ::event_core::DomainEvent as _;
    let paid = OrderPaid { order_id: 1 };
    assert_eq!(paid.event_no().unwrap().as_str(), "ORDER_PAID:1");
}
