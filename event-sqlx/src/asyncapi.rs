//! An AsyncAPI 3.0 document of what a service publishes: every event type and version with its
//! payload schema, the channels its routes name, a `send` operation per message, the headers
//! of the wire format, the broker's bindings and the aggregate id as the message key.
//!
//! ```
//! use event_sqlx::asyncapi::{AsyncApi, Protocol};
//! use event_sqlx::{OutboxConfig, Route, WireFormat};
//! use serde_json::json;
//!
//! let config = OutboxConfig::new().route("ORDER_PLACED", Route::topic("orders").routing_key("order.placed"));
//! let schema = json!({"type": "object", "properties": {"order_id": {"type": "string"}}, "x-aggregate-type": "ORDER"});
//! let document = AsyncApi::new("order-service", "1.4.0")
//!     .protocol(Protocol::Kafka)
//!     .format(WireFormat::CloudEventsBinary)
//!     .event("ORDER_PLACED", 1, schema)
//!     .document(&config)?;
//! assert_eq!(document["asyncapi"], "3.0.0");
//! assert_eq!(document["channels"]["orders"]["address"], "orders");
//! # Ok::<(), event_sqlx::asyncapi::AsyncApiError>(())
//! ```
//!
//! The payload schemas are written in JSON Schema draft-07, the draft AsyncAPI's tools read:
//! `$defs` move to `components/schemas` (named `<TYPE>-v<N>-<name>`), `prefixItems` become
//! `items`. [`AsyncApi::registered`] takes every event type derived in the program (its
//! current version), [`AsyncApi::snapshots`] every version in a snapshot directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use crate::config::outbox::OutboxConfig;
use crate::wire::WireFormat;

/// The broker a document describes: its channel addresses, headers and bindings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Protocol {
    /// NATS JetStream: the channel's address is the subject `<topic>.<routing key>`.
    #[default]
    Nats,
    /// RabbitMQ: the address is the routing key, on the topic exchange named by the topic.
    Amqp,
    /// Kafka: the address is the topic; the key is the aggregate id.
    Kafka,
}

impl Protocol {
    fn name(self) -> &'static str {
        match self {
            Protocol::Nats => "nats",
            Protocol::Amqp => "amqp",
            Protocol::Kafka => "kafka",
        }
    }
}

impl std::str::FromStr for Protocol {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name {
            "nats" => Ok(Protocol::Nats),
            "amqp" | "rabbitmq" => Ok(Protocol::Amqp),
            "kafka" => Ok(Protocol::Kafka),
            other => Err(format!(
                "unknown protocol `{other}`: use nats, amqp (RabbitMQ) or kafka"
            )),
        }
    }
}

/// Why a document could not be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AsyncApiError {
    /// A snapshot directory or file could not be read.
    #[error("cannot read the snapshots: {0}")]
    Snapshots(String),
    /// There is no event to describe.
    #[error(
        "no event to describe: add events with .event(..), .registered() (the derived events linked into this program) or .snapshots(dir)"
    )]
    NoEvents,
}

/// The description of a service's events, written as an AsyncAPI 3.0 document by
/// [`AsyncApi::document`].
#[derive(Debug, Clone)]
pub struct AsyncApi {
    title: String,
    version: String,
    description: Option<String>,
    protocol: Protocol,
    format: WireFormat,
    server: Option<String>,
    events: BTreeMap<(String, u32), Value>,
    snapshots: Vec<PathBuf>,
}

impl AsyncApi {
    /// A document for the service `title` at `version` (the service's, not an event's).
    pub fn new(title: impl Into<String>, version: impl Into<String>) -> AsyncApi {
        AsyncApi {
            title: title.into(),
            version: version.into(),
            description: None,
            protocol: Protocol::default(),
            format: WireFormat::default(),
            server: None,
            events: BTreeMap::new(),
            snapshots: Vec::new(),
        }
    }

    /// The document's description.
    pub fn description(self, text: impl Into<String>) -> Self {
        let description = Some(text.into());
        Self {
            description,
            ..self
        }
    }

    /// The broker (NATS by default).
    pub fn protocol(self, protocol: Protocol) -> Self {
        Self { protocol, ..self }
    }

    /// The wire format the publisher writes (the envelope by default): it decides the
    /// message's headers and payload.
    pub fn format(self, format: WireFormat) -> Self {
        Self { format, ..self }
    }

    /// A server, as `host:port` (the protocol is the document's).
    pub fn server(self, host: impl Into<String>) -> Self {
        let server = Some(host.into());
        Self { server, ..self }
    }

    /// Version `version` of `event_type`, with its payload schema as the derive writes it.
    pub fn event(mut self, event_type: impl Into<String>, version: u32, schema: Value) -> Self {
        self.events.insert((event_type.into(), version), schema);
        self
    }

    /// The event type `E` at its current version.
    pub fn with<E: event_core::DomainEvent>(self) -> Self {
        let schema = serde_json::to_value(E::event_schema()).unwrap_or(Value::Null);
        self.event(E::EVENT_TYPE, E::EVENT_VERSION, schema)
    }

    /// Every event type derived in this program, at its current version.
    pub fn registered(mut self) -> Self {
        for event in event_core::registered_events() {
            self.events.insert(
                (event.event_type.to_owned(), event.version),
                (event.schema)(),
            );
        }
        self
    }

    /// Every version of every event type in the snapshot directory `dir`
    /// (`<dir>/<EVENT_TYPE>/v<N>.json`), read when the document is written.
    pub fn snapshots(mut self, dir: impl AsRef<Path>) -> Self {
        self.snapshots.push(dir.as_ref().to_path_buf());
        self
    }

    /// The document, as JSON: events routed as `config` routes them.
    pub fn document(&self, config: &OutboxConfig) -> Result<Value, AsyncApiError> {
        let mut events = self.events.clone();
        for dir in &self.snapshots {
            read_snapshots(dir, &mut events)?;
        }
        if events.is_empty() {
            return Err(AsyncApiError::NoEvents);
        }
        let mut channels = Map::new();
        let mut operations = Map::new();
        let mut messages = Map::new();
        let mut schemas = Map::new();
        for ((event_type, version), schema) in &events {
            let key = format!("{}-v{version}", id(event_type));
            let aggregate = schema
                .get("x-aggregate-type")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let route = config.route_for(aggregate, event_type);
            let topic = route
                .topic
                .clone()
                .unwrap_or_else(|| event_type.to_ascii_lowercase());
            let (address, bindings) = match self.protocol {
                Protocol::Nats => match &route.routing_key {
                    Some(routing_key) => (format!("{topic}.{routing_key}"), None),
                    None => (topic.clone(), None),
                },
                Protocol::Amqp => (
                    route.routing_key.clone().unwrap_or_default(),
                    Some(json!({"amqp": {
                        "is": "routingKey",
                        "exchange": {"name": topic, "type": "topic", "durable": true, "autoDelete": false, "vhost": "/"},
                        "bindingVersion": "0.3.0",
                    }})),
                ),
                Protocol::Kafka => (
                    topic.clone(),
                    Some(json!({"kafka": {"topic": topic, "bindingVersion": "0.5.0"}})),
                ),
            };
            let channel_id = id(&match self.protocol {
                Protocol::Amqp => format!("{topic}-{address}"),
                _ => address.clone(),
            });
            let payload_schema = draft07(schema, &key, &mut schemas);
            messages.insert(
                key.clone(),
                self.message(event_type, *version, aggregate, payload_schema),
            );
            let channel = channels.entry(channel_id.clone()).or_insert_with(|| {
                let mut channel = json!({"address": address, "messages": {}});
                if let Some(bindings) = bindings {
                    channel["bindings"] = bindings;
                }
                channel
            });
            channel["messages"][&key] = json!({"$ref": format!("#/components/messages/{key}")});
            operations.insert(
                format!("send-{key}"),
                json!({
                    "action": "send",
                    "title": format!("Publish {event_type} v{version}"),
                    "channel": {"$ref": format!("#/channels/{channel_id}")},
                    "messages": [{"$ref": format!("#/channels/{channel_id}/messages/{key}")}],
                }),
            );
        }
        let mut info = json!({"title": self.title, "version": self.version});
        if let Some(description) = &self.description {
            info["description"] = json!(description);
        }
        let mut document = json!({
            "asyncapi": "3.0.0",
            "info": info,
            "defaultContentType": self.content_type(),
            "channels": channels,
            "operations": operations,
            "components": {"messages": messages, "schemas": schemas},
        });
        if let Some(host) = &self.server {
            document["servers"] =
                json!({"broker": {"host": host, "protocol": self.protocol.name()}});
        }
        Ok(document)
    }

    fn content_type(&self) -> &'static str {
        match self.format {
            WireFormat::CloudEventsStructured => crate::wire::STRUCTURED,
            _ => crate::wire::JSON,
        }
    }

    /// The message of one event version: headers and payload as the wire format writes them.
    fn message(&self, event_type: &str, version: u32, aggregate: &str, data: Value) -> Value {
        let string = json!({"type": "string"});
        let constant = |v: &str| json!({"type": "string", "const": v});
        let aggregate_type = if aggregate.is_empty() {
            string.clone()
        } else {
            constant(aggregate)
        };
        let mut headers = Map::new();
        let mut required = Vec::new();
        let mut header = |name: String, schema: Value, needed: bool| {
            if needed {
                required.push(Value::String(name.clone()));
            }
            headers.insert(name, schema);
        };
        let binding_prefix = match self.protocol {
            Protocol::Kafka => "ce_",
            _ => "ce-",
        };
        let (payload, correlation) = match self.format {
            WireFormat::Envelope => {
                match self.protocol {
                    Protocol::Nats => header("Nats-Msg-Id".into(), string.clone(), true),
                    Protocol::Kafka => header("messageId".into(), string.clone(), true),
                    Protocol::Amqp => {}
                }
                for (name, schema) in [
                    ("eventId", string.clone()),
                    ("eventType", constant(event_type)),
                    ("eventVersion", constant(&version.to_string())),
                    ("aggregateType", aggregate_type.clone()),
                    ("aggregateId", string.clone()),
                    (
                        "aggregateSequence",
                        json!({"type": "string", "pattern": "^[0-9]+$"}),
                    ),
                ] {
                    header(name.into(), schema, true);
                }
                header("traceparent".into(), string.clone(), false);
                let payload = json!({
                    "type": "object",
                    "description": "This toolkit's envelope: the event's metadata and its payload.",
                    "required": ["eventId", "eventType", "eventVersion", "aggregateType", "aggregateId", "aggregateSequence", "occurredAt", "payload"],
                    "properties": {
                        "eventId": {"type": "string", "description": "The event number: the idempotency key consumers deduplicate on."},
                        "eventType": constant(event_type),
                        "eventVersion": {"type": "integer", "const": version},
                        "aggregateType": aggregate_type,
                        "aggregateId": string,
                        "aggregateSequence": {"type": "integer", "minimum": 1},
                        "occurredAt": {"type": "string", "format": "date-time"},
                        "traceId": {"type": ["string", "null"]},
                        "headers": {"type": "object", "additionalProperties": {"type": "string"}},
                        "payload": data,
                    },
                });
                (payload, "$message.header#/eventId".to_owned())
            }
            WireFormat::CloudEventsBinary => {
                for (name, schema, needed) in ce_attributes(event_type, version, &aggregate_type) {
                    header(format!("{binding_prefix}{name}"), schema, needed);
                }
                if self.protocol != Protocol::Amqp {
                    header("content-type".into(), constant(crate::wire::JSON), true);
                }
                (data, format!("$message.header#/{binding_prefix}id"))
            }
            WireFormat::CloudEventsStructured => {
                if self.protocol != Protocol::Amqp {
                    let content_type = "application/cloudevents+json; charset=UTF-8";
                    header("content-type".into(), constant(content_type), true);
                }
                let mut properties = Map::new();
                let mut needed = Vec::new();
                for (name, schema, required) in ce_attributes(event_type, version, &aggregate_type)
                {
                    if required {
                        needed.push(Value::String(name.to_owned()));
                    }
                    properties.insert(name.to_owned(), schema);
                }
                properties.insert("datacontenttype".into(), constant(crate::wire::JSON));
                properties.insert("data".into(), data);
                needed.push(json!("data"));
                let payload = json!({
                    "type": "object",
                    "description": "A CloudEvents 1.0 event in the JSON event format.",
                    "required": needed,
                    "properties": properties,
                });
                (payload, "$message.payload#/id".to_owned())
            }
        };
        let mut message = json!({
            "name": event_type,
            "title": format!("{event_type} v{version}"),
            "contentType": self.content_type(),
            "headers": {"type": "object", "required": required, "properties": headers},
            "payload": payload,
            "correlationId": {"location": correlation},
        });
        match self.protocol {
            Protocol::Kafka => {
                message["bindings"] = json!({"kafka": {
                    "key": {"type": "string", "description": "The aggregate id: every event of one aggregate goes to one partition, in order."},
                    "bindingVersion": "0.5.0",
                }});
            }
            Protocol::Amqp => {
                message["bindings"] =
                    json!({"amqp": {"messageType": event_type, "bindingVersion": "0.3.0"}});
            }
            Protocol::Nats => {}
        }
        message
    }
}

/// The CloudEvents attributes and extensions the mapping writes: name, schema, required.
fn ce_attributes(
    event_type: &str,
    version: u32,
    aggregate_type: &Value,
) -> Vec<(&'static str, Value, bool)> {
    let string = json!({"type": "string"});
    vec![
        (
            "specversion",
            json!({"type": "string", "const": "1.0"}),
            true,
        ),
        ("id", string.clone(), true),
        (
            "source",
            json!({"type": "string", "format": "uri-reference"}),
            true,
        ),
        ("type", json!({"type": "string", "const": event_type}), true),
        ("subject", string.clone(), true),
        (
            "time",
            json!({"type": "string", "format": "date-time"}),
            true,
        ),
        (
            "dataschema",
            json!({"type": "string", "const": format!("urn:event-type:{event_type}:v{version}")}),
            true,
        ),
        ("aggregatetype", aggregate_type.clone(), true),
        ("partitionkey", string.clone(), true),
        (
            "sequence",
            json!({"type": "string", "pattern": "^[0-9]{20}$"}),
            true,
        ),
        ("tenantid", string.clone(), false),
        ("correlationid", string.clone(), false),
        ("causationid", string.clone(), false),
        ("traceparent", string, false),
        // Set by the relay when the events before this one were cancelled (see
        // PREVIOUS_SEQUENCE_HEADER).
        (
            crate::wire::PREVIOUS_SEQUENCE_HEADER,
            json!({"type": "string", "pattern": "^[0-9]+$"}),
            false,
        ),
    ]
}

/// A name AsyncAPI takes as a component or channel key: `[A-Za-z0-9_-]`, anything else `_`.
fn id(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// `schema` (JSON Schema 2020-12, as the derive writes it) in draft-07, its `$defs` moved to
/// `schemas` under `<prefix>-<name>`.
fn draft07(schema: &Value, prefix: &str, schemas: &mut Map<String, Value>) -> Value {
    let mut schema = schema.clone();
    let defs = schema
        .as_object_mut()
        .and_then(|o| o.remove("$defs").or_else(|| o.remove("definitions")));
    if let Some(Value::Object(defs)) = defs {
        for (name, def) in defs {
            let mut def = def;
            rewrite(&mut def, prefix);
            schemas.insert(format!("{prefix}-{}", id(&name)), def);
        }
    }
    if let Some(o) = schema.as_object_mut() {
        o.remove("$schema");
        o.remove("$id");
        o.remove("x-event-snapshot");
    }
    rewrite(&mut schema, prefix);
    schema
}

/// Rewrites 2020-12 keywords draft-07 lacks, and local `$ref`s to the hoisted definitions.
fn rewrite(value: &mut Value, prefix: &str) {
    match value {
        Value::Object(o) => {
            if let Some(Value::String(target)) = o.get_mut("$ref") {
                for local in ["#/$defs/", "#/definitions/"] {
                    if let Some(name) = target.strip_prefix(local) {
                        *target = format!("#/components/schemas/{prefix}-{}", id(name));
                        break;
                    }
                }
            }
            if let Some(items) = o.remove("prefixItems") {
                if let Some(rest) = o.remove("items") {
                    o.insert("additionalItems".into(), rest);
                }
                o.insert("items".into(), items);
            }
            if let Some(required) = o.remove("dependentRequired") {
                o.insert("dependencies".into(), required);
            }
            for child in o.values_mut() {
                rewrite(child, prefix);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| rewrite(v, prefix)),
        _ => {}
    }
}

fn read_snapshots(
    dir: &Path,
    events: &mut BTreeMap<(String, u32), Value>,
) -> Result<(), AsyncApiError> {
    use event_core::schema::snapshot::{read_type_dir, type_dirs};
    let fail = |e: event_core::schema::snapshot::Problem| AsyncApiError::Snapshots(e.to_string());
    for (event_type, type_dir) in type_dirs(dir).map_err(fail)? {
        for (version, schema) in read_type_dir(&type_dir).map_err(fail)? {
            events.insert((event_type.clone(), version), schema);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definitions_move_to_components_and_refs_follow() {
        let mut schemas = Map::new();
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {
                "line": {"$ref": "#/$defs/Line"},
                "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": false},
            },
            "$defs": {"Line": {"type": "object", "properties": {"sku": {"type": "string"}}}},
        });
        let out = draft07(&schema, "ORDER_PLACED-v1", &mut schemas);
        assert_eq!(
            out["properties"]["line"]["$ref"],
            "#/components/schemas/ORDER_PLACED-v1-Line"
        );
        assert_eq!(out["properties"]["pair"]["items"][1]["type"], "integer");
        assert_eq!(out["properties"]["pair"]["additionalItems"], false);
        assert!(out.get("$schema").is_none() && out.get("$defs").is_none());
        assert!(schemas.contains_key("ORDER_PLACED-v1-Line"));
    }

    #[test]
    fn a_document_without_events_says_how_to_add_them() {
        let error = AsyncApi::new("s", "1")
            .document(&OutboxConfig::new())
            .unwrap_err();
        assert!(error.to_string().contains(".registered()"), "{error}");
    }

    #[test]
    fn unreadable_snapshots_are_an_error_naming_the_directory() {
        let error = AsyncApi::new("s", "1")
            .snapshots("/nonexistent/schemas")
            .document(&OutboxConfig::new())
            .unwrap_err();
        assert!(
            error.to_string().contains("/nonexistent/schemas"),
            "{error}"
        );
    }
}
