use event_core::DomainEvent;

#[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent)]
#[domain_event(event_no = "{type}-{r#match}")]
struct r#Match {
    #[domain_event(aggregate_id)]
    r#type: String,
    r#match: u8,
}

fn main() {
    assert_eq!(r#Match::EVENT_TYPE, "MATCH");
    let m = r#Match { r#type: "t".into(), r#match: 3 };
    assert_eq!(m.event_no().unwrap().as_str(), "t-3");
    assert_eq!(m.aggregate_id().as_deref(), Some("t"));
}
