use event_core::DomainEvent;

#[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent)]
struct HTTPRequestSent {
    url: String,
}

#[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event()]
struct Empty {}

fn main() {
    assert_eq!(HTTPRequestSent::EVENT_TYPE, "HTTP_REQUEST_SENT");
    assert_eq!(HTTPRequestSent::EVENT_VERSION, 1);
    assert_eq!(HTTPRequestSent::AGGREGATE_TYPE, None);
    let sent = HTTPRequestSent { url: "u".into() };
    assert!(sent.aggregate_id().is_none());
    assert!(sent.event_no().is_none());
    assert_eq!(Empty::EVENT_TYPE, "EMPTY");
}
