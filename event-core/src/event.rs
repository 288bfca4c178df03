//! The `DomainEvent` trait that `#[derive(DomainEvent)]` implements.

use schemars::{JsonSchema, Schema, SchemaGenerator, generate::SchemaSettings};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::EventNo;

/// A domain event payload: a serde struct with a stable type, a version, an optional aggregate,
/// a deterministic event number and a JSON schema.
///
/// Implement it with `#[derive(DomainEvent)]`:
///
/// ```
/// use event_core::DomainEvent;
///
/// #[derive(Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent)]
/// #[domain_event(event_type = "ORDER_PAID", version = 2, aggregate = "ORDER", event_no = "ORDER_PAID:{order_id}")]
/// pub struct OrderPaid {
///     #[domain_event(aggregate_id)]
///     pub order_id: String,
///     pub amount_minor: i64,
///     pub currency: String,
/// }
///
/// let paid = OrderPaid { order_id: "o-1".into(), amount_minor: 1999, currency: "EUR".into() };
/// assert_eq!(OrderPaid::EVENT_TYPE, "ORDER_PAID");
/// assert_eq!(OrderPaid::EVENT_VERSION, 2);
/// assert_eq!(OrderPaid::AGGREGATE_TYPE, Some("ORDER"));
/// assert_eq!(paid.aggregate_id().as_deref(), Some("o-1"));
/// assert_eq!(paid.event_no().unwrap().as_str(), "ORDER_PAID:o-1");
///
/// let schema = OrderPaid::event_schema();
/// assert_eq!(schema.get("x-event-type"), Some(&serde_json::json!("ORDER_PAID")));
/// assert_eq!(schema.get("x-event-version"), Some(&serde_json::json!(2)));
/// ```
///
/// # Attributes
/// On the struct, `#[domain_event(...)]` with any of these keys:
///
/// | key | value | default |
/// |---|---|---|
/// | `event_type` | `"ORDER_PAID"`, matching `[A-Za-z][A-Za-z0-9_.-]{0,63}` | the type name in SCREAMING_SNAKE_CASE |
/// | `version` | an integer from 1 | `1` |
/// | `aggregate` | the aggregate type, e.g. `"ORDER"`, same shape as `event_type` | none: the aggregate it is recorded on |
/// | `event_no` | a template of fields, e.g. `"ORDER_PAID:{order_id}"`; `{{` and `}}` for braces | none: the unit of work assigns `{EVENT_TYPE}:{aggregate_type}:{aggregate_id}:{aggregate_sequence}` |
/// | `crate` | the path of this crate when it is renamed, e.g. `"::my_events"` | `"::event_core"` |
///
/// On one field, `#[domain_event(aggregate_id)]` marks the aggregate's id. Template fields and the
/// aggregate id field must implement `Display`.
///
/// Enums, tuple structs, unit structs, unions and generic structs are rejected at compile time:
/// each event is one struct with named fields, one type and one schema.
pub trait DomainEvent: Serialize + DeserializeOwned + JsonSchema {
    /// The stable event type, e.g. `ORDER_PAID`. It never changes for the life of the event.
    const EVENT_TYPE: &'static str;

    /// The payload version, from 1. Bump it when the payload changes in a way readers notice.
    const EVENT_VERSION: u32;

    /// The aggregate type the event belongs to, when declared with `aggregate = "..."`.
    const AGGREGATE_TYPE: Option<&'static str>;

    /// The aggregate id, when a field is marked `#[domain_event(aggregate_id)]`.
    fn aggregate_id(&self) -> Option<String>;

    /// The event number rendered from the `event_no` template, when there is one; otherwise the
    /// unit of work assigns the default (see [`EventNo`]).
    fn event_no(&self) -> Option<EventNo>;

    /// The fields that accept other names (`#[serde(alias = "..")]`): (name, aliases). Written by
    /// the derive; the schema carries them as `x-aliases`, so that a rename with an alias is seen
    /// as compatible.
    #[doc(hidden)]
    fn serde_aliases() -> &'static [(&'static str, &'static [&'static str])]
    where
        Self: Sized,
    {
        &[]
    }

    /// The payload's JSON schema (draft 2020-12), carrying `x-event-type`, `x-event-version`,
    /// when declared `x-aggregate-type`, and `x-aliases` on fields that accept old names.
    fn event_schema() -> Schema
    where
        Self: Sized,
    {
        event_schema_for::<Self>()
    }
}

/// The settings every event schema is generated with. They are part of the snapshot contract:
/// the same type gives the same schema.
pub fn schema_settings() -> SchemaSettings {
    SchemaSettings::draft2020_12()
}

fn event_schema_for<E: DomainEvent>() -> Schema {
    let mut schema = SchemaGenerator::new(schema_settings()).into_root_schema_for::<E>();
    schema.insert("x-event-type".to_owned(), E::EVENT_TYPE.into());
    schema.insert("x-event-version".to_owned(), E::EVENT_VERSION.into());
    if let Some(aggregate) = E::AGGREGATE_TYPE {
        schema.insert("x-aggregate-type".to_owned(), aggregate.into());
    }
    for (field, aliases) in E::serde_aliases() {
        if let Some(property) = schema
            .get_mut("properties")
            .and_then(|p| p.get_mut(*field))
            .and_then(|p| p.as_object_mut())
        {
            property.insert("x-aliases".to_owned(), serde_json::json!(aliases));
        }
    }
    schema
}

/// A derived event type, registered by `#[derive(DomainEvent)]` so that the snapshot check sees
/// every event in the program.
#[doc(hidden)]
pub struct EventRegistration {
    /// `EVENT_TYPE`.
    pub event_type: &'static str,
    /// `EVENT_VERSION`.
    pub version: u32,
    /// The Rust type's path, for messages.
    pub rust_type: &'static str,
    /// The compatibility mode set with `compatibility = "..."`.
    pub compatibility: &'static str,
    /// The payload schema.
    pub schema: fn() -> serde_json::Value,
    /// Reads a payload as the Rust type and writes it back: what a reader of the payload sees.
    pub roundtrip: fn(&serde_json::Value) -> Result<serde_json::Value, String>,
}

inventory::collect!(EventRegistration);

/// `E`'s schema as JSON, for [`EventRegistration::schema`].
#[doc(hidden)]
pub fn event_schema_value<E: DomainEvent>() -> serde_json::Value {
    serde_json::to_value(E::event_schema()).unwrap_or(serde_json::Value::Null)
}

/// `payload` read as `E` and written back, for [`EventRegistration::roundtrip`].
#[doc(hidden)]
pub fn event_roundtrip<E: DomainEvent>(
    payload: &serde_json::Value,
) -> Result<serde_json::Value, String> {
    let event: E =
        E::deserialize(payload).map_err(|e| format!("cannot be read as the event: {e}"))?;
    serde_json::to_value(&event).map_err(|e| format!("cannot be written back: {e}"))
}

/// Every event type derived in this program, in no particular order.
pub fn registered_events() -> impl Iterator<Item = &'static EventRegistration> {
    inventory::iter::<EventRegistration>.into_iter()
}
