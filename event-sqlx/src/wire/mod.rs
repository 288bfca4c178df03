//! How an event looks on a broker: this toolkit's own envelope (the default), or a CloudEvents
//! 1.0 event in binary or structured content mode, so that services written in other
//! languages read and write the events with their own CloudEvents SDK.
//!
//! # The CloudEvents mapping
//!
//! | CloudEvents attribute | from the envelope | notes |
//! |---|---|---|
//! | `specversion` | `1.0` | |
//! | `id` | `eventId`, the event number | what consumers deduplicate on |
//! | `source` | `headers.source`, the producing service as given to `EventContext::new` (`order-service`) | a URI reference; `/` when the envelope names none |
//! | `type` | `eventType` (`ORDER_PAID`) | the same for every version |
//! | `dataschema` | `urn:event-type:{eventType}:v{eventVersion}` | the version, following the primer's advice to keep `type` stable and version the schema |
//! | `subject` | `aggregateId` | |
//! | `time` | `occurredAt`, RFC 3339 in UTC with microseconds | |
//! | `datacontenttype` | `application/json` | the data is the payload's JSON |
//! | `aggregatetype` (extension) | `aggregateType` | |
//! | `partitionkey` (Partitioning extension) | `aggregateId` | Kafka's message key |
//! | `sequence` (Sequence extension) | `aggregateSequence`, as 20 digits | zero-padded, so string order is sequence order |
//! | `tenantid`, `correlationid`, `causationid` (extensions) | `headers.tenantId`, `headers.correlationId`, `headers.causationId` | when set |
//! | `traceparent` (Distributed Tracing extension) | `headers.traceparent` | when set |
//! | `traceid` (extension) | `traceId` | only when it is not the trace id of `traceparent` |
//! | `previoussequence` (extension) | `headers.extra["previoussequence"]` | set by the relay when the aggregate's previous events were cancelled: the sequence of the last one that was not (see [`PREVIOUS_SEQUENCE_HEADER`]) |
//! | other extensions | `headers.extra` | a header whose name is a valid extension name (lowercase letters and digits) goes as itself; the others together as one JSON object in `extraheaders` |
//!
//! Per broker, as each binding says:
//! - **Kafka** (Kafka protocol binding): binary mode puts each attribute in a `ce_` header and
//!   `datacontenttype` in `content-type`; structured mode sends the event's JSON with
//!   `content-type: application/cloudevents+json; charset=UTF-8`. The key is the aggregate id
//!   (`partitionkey`) in every format.
//! - **RabbitMQ** (the RabbitMQ binding the CloudEvents SDKs implement for AMQP 0-9-1): `ce-`
//!   headers and the `content_type` property; structured mode sets `content_type` to
//!   `application/cloudevents+json`. Reading also takes the AMQP binding's `cloudEvents:` and
//!   `cloudEvents_` prefixes.
//! - **NATS** (the HTTP-style headers of the NATS binding's draft): `ce-` headers, values
//!   percent-encoded as the HTTP binding says, and `content-type`.
//!
//! Every format keeps the broker's own deduplication id (`Nats-Msg-Id`, AMQP `message_id`, the
//! Kafka `messageId` header) and, when the event has one, the plain W3C `traceparent` header.
//!
//! # Reading
//!
//! Subscriptions read all three formats, whatever their publisher sends: a message with a
//! `specversion` attribute header is a binary-mode CloudEvent, one whose content type starts
//! with `application/cloudevents` a structured one, anything else an envelope. Handlers get the
//! same `Delivered<E>`, the inbox deduplicates on `id`, upcasters apply.
//!
//! A CloudEvent from another producer need not carry this toolkit's extensions. The rule for
//! what is missing: the version is 1 unless `dataschema` has the form above; the aggregate
//! type is `aggregatetype`, else `source`; the aggregate id is `partitionkey`, else `subject`,
//! else `id`; without `sequence` the event is unordered (sequence 0: the per-aggregate order
//! and the stale check pass it through); without `time` it occurred when it was read. Its data
//! must be JSON (`datacontenttype` absent, `application/json` or any `+json` type), as handlers
//! read JSON payloads.
//!
//! A message that claims to be a CloudEvent and is not one (no `id`, `specversion` other than
//! 1.0, a `time` that is not RFC 3339, data that is not JSON, a batch) is quarantined as a
//! permanent failure whose reason names the problem.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use base64::Engine as _;
use chrono::{DateTime, SecondsFormat, Utc};
use event_core::{EventEnvelope, EventHeaders, EventNo, MAX_AGGREGATE_ID_LEN, Traceparent};
use serde_json::{Map, Value};

/// How a publisher writes events on its broker: see the [module](self) for the CloudEvents
/// mapping. Subscriptions read every format.
///
/// ```
/// use event_sqlx::WireFormat;
///
/// assert_eq!("binary".parse::<WireFormat>(), Ok(WireFormat::CloudEventsBinary));
/// assert_eq!(WireFormat::default(), WireFormat::Envelope);
/// assert_eq!(WireFormat::CloudEventsStructured.to_string(), "structured");
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum WireFormat {
    /// The envelope's JSON as the body, the event's metadata as headers (`eventId`,
    /// `eventType`, ...): this toolkit's own format, and the default.
    #[default]
    Envelope = 0,
    /// CloudEvents binary content mode: the attributes as headers, the payload's JSON as the
    /// body.
    CloudEventsBinary = 1,
    /// CloudEvents structured content mode: the whole event, attributes and data, as one JSON
    /// object in the body (`application/cloudevents+json`).
    CloudEventsStructured = 2,
}

impl WireFormat {
    /// The names [`WireFormat::from_str`] takes, as `eventctl relay --format` shows them.
    pub const NAMES: [&'static str; 3] = ["envelope", "binary", "structured"];

    /// The format's name: `envelope`, `binary` or `structured`.
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }
}

impl fmt::Display for WireFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A wire format name that is none of `envelope`, `binary`, `structured`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown wire format `{0}`: use envelope (this toolkit's own), binary (CloudEvents binary mode) or structured (CloudEvents structured mode)"
)]
pub struct UnknownWireFormat(String);

impl FromStr for WireFormat {
    type Err = UnknownWireFormat;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name.trim().to_ascii_lowercase().as_str() {
            "envelope" => Ok(WireFormat::Envelope),
            "binary" | "cloudevents-binary" => Ok(WireFormat::CloudEventsBinary),
            "structured" | "cloudevents-structured" => Ok(WireFormat::CloudEventsStructured),
            _ => Err(UnknownWireFormat(name.chars().take(64).collect())),
        }
    }
}

/// The header (in `headers.extra`; a CloudEvents extension of the same name) in which the relay
/// tells consumers that an event does not follow its predecessor: the aggregate's sequence
/// `previous` (as decimal digits) is the last one before this event that was not cancelled,
/// and every sequence between them was cancelled or deleted in the outbox, so it will never be
/// published. `0` means every earlier event was cancelled.
///
/// A consumer built with [`Consumer::in_order`](crate::Consumer::in_order) then applies the
/// event once `previous` is applied, instead of waiting its
/// [`order_wait`](crate::Consumer::order_wait) for sequences that will never come. Events whose
/// previous sequence is published, most of them, do not carry it.
///
/// Only the relay sets it: a header of this name that the application added to the event
/// (`EventContext::header`) is dropped when the relay claims the event, or when it is sent
/// again ([`Outbox::republish`](crate::Outbox::republish), reconciliation's repair).
///
/// ```
/// use event_sqlx::PREVIOUS_SEQUENCE_HEADER;
///
/// assert_eq!(PREVIOUS_SEQUENCE_HEADER, "previoussequence");
/// ```
pub const PREVIOUS_SEQUENCE_HEADER: &str = "previoussequence";

/// The media type of a structured-mode CloudEvent in JSON.
pub(crate) const STRUCTURED: &str = "application/cloudevents+json";
/// The data's media type.
pub(crate) const JSON: &str = "application/json";

/// Attributes and extensions this mapping writes itself; an extra header of one of these names
/// travels in `extraheaders`.
const RESERVED: [&str; 22] = [
    "specversion",
    "id",
    "source",
    "type",
    "subject",
    "time",
    "dataschema",
    "datacontenttype",
    "data",
    "data_base64",
    "aggregatetype",
    "partitionkey",
    "sequence",
    "tenantid",
    "correlationid",
    "causationid",
    "traceparent",
    "tracestate",
    "traceid",
    "extraheaders",
    "datacontentencoding",
    "schemaurl",
];

fn is_extension_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && !RESERVED.contains(&name)
}

/// The `dataschema` of version `version` of `event_type`.
fn dataschema(event_type: &str, version: u32) -> String {
    format!("urn:event-type:{event_type}:v{version}")
}

/// The CloudEvents attributes of `envelope`, but `datacontenttype`: names and string values,
/// required attributes first.
pub(crate) fn attributes(envelope: &EventEnvelope) -> Vec<(Cow<'static, str>, String)> {
    let e = envelope;
    let h = &e.headers;
    let source = h.source.as_deref().filter(|s| !s.is_empty()).unwrap_or("/");
    let mut out: Vec<(Cow<'static, str>, String)> = vec![
        ("specversion".into(), "1.0".to_owned()),
        ("id".into(), e.event_id.to_string()),
        ("source".into(), source.to_owned()),
        ("type".into(), e.event_type.clone()),
        ("subject".into(), e.aggregate_id.clone()),
        (
            "time".into(),
            e.occurred_at.to_rfc3339_opts(SecondsFormat::Micros, true),
        ),
        (
            "dataschema".into(),
            dataschema(&e.event_type, e.event_version),
        ),
        ("aggregatetype".into(), e.aggregate_type.clone()),
        ("partitionkey".into(), e.aggregate_id.clone()),
        ("sequence".into(), format!("{:020}", e.aggregate_sequence)),
    ];
    let optional = [
        ("tenantid", &h.tenant_id),
        ("correlationid", &h.correlation_id),
        ("causationid", &h.causation_id),
        ("traceparent", &h.traceparent),
    ];
    for (name, value) in optional {
        if let Some(value) = value {
            out.push((name.into(), value.clone()));
        }
    }
    let traced = h
        .traceparent
        .as_deref()
        .and_then(|t| t.parse::<Traceparent>().ok());
    if let Some(trace_id) = &e.trace_id
        && traced.as_ref().map(Traceparent::trace_id) != Some(trace_id.as_str())
    {
        out.push(("traceid".into(), trace_id.clone()));
    }
    let mut others = Map::new();
    for (name, value) in &h.extra {
        if is_extension_name(name) {
            out.push((Cow::Owned(name.clone()), value.clone()));
        } else {
            others.insert(name.clone(), Value::String(value.clone()));
        }
    }
    if !others.is_empty() {
        out.push(("extraheaders".into(), Value::Object(others).to_string()));
    }
    out
}

/// The structured-mode event of `envelope`: its attributes, `datacontenttype` and `data`.
pub(crate) fn structured(envelope: &EventEnvelope) -> Result<Vec<u8>, serde_json::Error> {
    let mut event = Map::new();
    for (name, value) in attributes(envelope) {
        event.insert(name.into_owned(), Value::String(value));
    }
    event.insert("datacontenttype".to_owned(), Value::String(JSON.to_owned()));
    event.insert("data".to_owned(), envelope.payload.clone());
    serde_json::to_vec(&Value::Object(event))
}

/// `value` percent-encoded as the HTTP binding asks of a header value: space, `"`, `%` and
/// every character outside printable ASCII.
pub(crate) fn percent_encode(value: &str) -> Cow<'_, str> {
    const SET: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
        .add(b' ')
        .add(b'"')
        .add(b'%')
        .add(0x7f);
    percent_encoding::utf8_percent_encode(value, SET).into()
}

/// A header value decoded from the HTTP binding's percent-encoding.
#[allow(dead_code)] // used by the nats feature
pub(crate) fn percent_decode(value: &str) -> String {
    percent_encoding::percent_decode_str(value)
        .decode_utf8_lossy()
        .into_owned()
}

/// A message as a subscription received it, with what a CloudEvent needs read off the broker's
/// headers.
#[derive(Debug, Default)]
pub(crate) struct Inbound<'a> {
    /// The body.
    pub(crate) body: &'a [u8],
    /// The content type (property or header).
    pub(crate) content_type: Option<String>,
    /// Binary-mode attributes: the names without their prefix, lowercased; the values decoded.
    pub(crate) attributes: Vec<(String, String)>,
}

/// What a received message holds.
#[derive(Debug)]
pub(crate) enum Decoded<'a> {
    /// Not a CloudEvent: the body is read as an envelope.
    Envelope(&'a [u8]),
    /// A CloudEvent, as the envelope's JSON.
    CloudEvent(Vec<u8>),
    /// It claims to be a CloudEvent and is not one: why.
    Invalid(String),
}

impl<'a> Inbound<'a> {
    /// Reads the message; `now` is the time an event without `time` occurred.
    pub(crate) fn decode(self, now: DateTime<Utc>) -> Decoded<'a> {
        let structured = self
            .content_type
            .as_deref()
            .map(str::trim_start)
            .filter(|t| {
                let prefix = "application/cloudevents";
                t.get(..prefix.len())
                    .is_some_and(|head| head.eq_ignore_ascii_case(prefix))
            });
        let read = if let Some(content_type) = structured {
            read_structured(content_type, self.body, now)
        } else if self
            .attributes
            .iter()
            .any(|(name, _)| name == "specversion")
        {
            let attributes = self.attributes.into_iter().collect();
            read_binary(attributes, self.content_type.as_deref(), self.body, now)
        } else {
            return Decoded::Envelope(self.body);
        };
        match read.and_then(|envelope| {
            serde_json::to_vec(&envelope).map_err(|e| format!("cannot write its envelope: {e}"))
        }) {
            Ok(json) => Decoded::CloudEvent(json),
            Err(problem) => Decoded::Invalid(format!("not a readable CloudEvent: {problem}")),
        }
    }
}

fn read_structured(
    content_type: &str,
    body: &[u8],
    now: DateTime<Utc>,
) -> Result<EventEnvelope, String> {
    let media = media_type(content_type);
    match media.as_str() {
        STRUCTURED => {}
        "application/cloudevents-batch+json" => {
            return Err(
                "a batch of CloudEvents (application/cloudevents-batch+json): send one event per message"
                    .to_owned(),
            );
        }
        other => {
            return Err(format!(
                "content type {other} is an event format this toolkit does not read: use application/cloudevents+json"
            ));
        }
    }
    let event: Map<String, Value> =
        serde_json::from_slice(body).map_err(|e| format!("the body is not a JSON object ({e})"))?;
    let mut attributes = BTreeMap::new();
    let mut data = None;
    let mut data_base64 = None;
    for (name, value) in event {
        match (name.as_str(), value) {
            ("data", value) => data = Some(value),
            ("data_base64", Value::String(text)) => data_base64 = Some(text),
            ("data_base64", _) => return Err("data_base64 is not a string".to_owned()),
            (_, Value::Null) => {}
            (_, Value::String(text)) => {
                attributes.insert(name, text);
            }
            (_, value @ (Value::Number(_) | Value::Bool(_))) => {
                attributes.insert(name, value.to_string());
            }
            (_, _) => {
                return Err(format!(
                    "attribute {name} is an array or an object: attributes are strings, numbers or booleans"
                ));
            }
        }
    }
    let content_type = attributes.get("datacontenttype").cloned();
    let payload = match (data, data_base64) {
        (Some(_), Some(_)) => return Err("it has both data and data_base64".to_owned()),
        (Some(value), None) => {
            json_content(content_type.as_deref())?;
            value
        }
        (None, Some(text)) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(text.as_bytes())
                .map_err(|e| format!("data_base64 is not base64 ({e})"))?;
            json_data(content_type.as_deref(), &bytes)?
        }
        (None, None) => Value::Null,
    };
    envelope(attributes, payload, now)
}

fn read_binary(
    attributes: BTreeMap<String, String>,
    content_type: Option<&str>,
    body: &[u8],
    now: DateTime<Utc>,
) -> Result<EventEnvelope, String> {
    let payload = json_data(content_type, body)?;
    envelope(attributes, payload, now)
}

/// The media type of a content type, lowercased, without its parameters (`; charset=...`).
fn media_type(content_type: &str) -> String {
    let media = content_type.split(';').next().unwrap_or_default();
    media.trim().to_ascii_lowercase()
}

/// Whether data of `content_type` is JSON: absent, `application/json`, `text/json` or any
/// `+json` type.
fn json_content(content_type: Option<&str>) -> Result<(), String> {
    let Some(content_type) = content_type else {
        return Ok(());
    };
    let media = media_type(content_type);
    if media == JSON || media == "text/json" || media.ends_with("+json") {
        Ok(())
    } else {
        Err(format!(
            "its data is {media}: handlers read JSON payloads, send datacontenttype application/json"
        ))
    }
}

fn json_data(content_type: Option<&str>, bytes: &[u8]) -> Result<Value, String> {
    json_content(content_type)?;
    if bytes.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(bytes).map_err(|e| format!("its data is not JSON ({e})"))
}

/// The envelope of a CloudEvent's `attributes` and `payload`, by the rule in the module docs.
fn envelope(
    mut attributes: BTreeMap<String, String>,
    payload: Value,
    now: DateTime<Utc>,
) -> Result<EventEnvelope, String> {
    let mut take = |name: &str| attributes.remove(name).filter(|v| !v.is_empty());
    match take("specversion").as_deref() {
        Some("1.0") => {}
        Some(other) => {
            return Err(format!("specversion {other}: only CloudEvents 1.0 is read"));
        }
        None => return Err("it has no specversion".to_owned()),
    }
    let id = take("id").ok_or("it has no id")?;
    let source = take("source").ok_or("it has no source")?;
    let event_type = take("type").ok_or("it has no type")?;
    if event_type.len() > 64 {
        return Err(format!(
            "its type is {} bytes long: event types are at most 64",
            event_type.len()
        ));
    }
    let occurred_at = match take("time") {
        Some(time) => DateTime::parse_from_rfc3339(&time)
            .map_err(|e| format!("time {time} is not an RFC 3339 timestamp ({e})"))?
            .with_timezone(&Utc),
        None => now,
    };
    let prefix = format!("urn:event-type:{event_type}:v");
    let event_version = match take("dataschema") {
        Some(schema) => match schema.strip_prefix(&prefix) {
            Some(version) => version
                .parse::<u32>()
                .ok()
                .filter(|&v| v > 0)
                .ok_or_else(|| format!("dataschema {schema} names no version from 1"))?,
            None => 1,
        },
        None => 1,
    };
    let subject = take("subject");
    let aggregate_type = take("aggregatetype").unwrap_or_else(|| source.clone());
    if aggregate_type.len() > 64 {
        return Err(format!(
            "its aggregate type (aggregatetype, else source) is {} bytes long, at most 64: set the aggregatetype extension",
            aggregate_type.len()
        ));
    }
    let aggregate_id = take("partitionkey")
        .or(subject)
        .unwrap_or_else(|| id.clone());
    if aggregate_id.len() > MAX_AGGREGATE_ID_LEN {
        return Err(format!(
            "its aggregate id (partitionkey, else subject, else id) is {} bytes long, at most {MAX_AGGREGATE_ID_LEN}",
            aggregate_id.len()
        ));
    }
    let aggregate_sequence = match take("sequence") {
        Some(sequence) => sequence.parse::<u64>().map_err(|_| {
            format!("sequence {sequence} is not a number: the per-aggregate order reads sequences as numbers")
        })?,
        None => 0,
    };
    let traceparent = take("traceparent");
    let trace_id = take("traceid").or_else(|| {
        traceparent
            .as_deref()
            .and_then(|t| t.parse::<Traceparent>().ok())
            .map(|t| t.trace_id().to_owned())
    });
    let mut headers = EventHeaders {
        tenant_id: take("tenantid"),
        correlation_id: take("correlationid"),
        causation_id: take("causationid"),
        source: Some(source),
        traceparent,
        extra: BTreeMap::new(),
    };
    if let Some(others) = take("extraheaders") {
        let others: BTreeMap<String, String> = serde_json::from_str(&others)
            .map_err(|e| format!("extraheaders is not a JSON object of strings ({e})"))?;
        headers.extra.extend(others);
    }
    attributes.remove("datacontenttype");
    headers.extra.extend(attributes);
    Ok(EventEnvelope {
        event_id: EventNo::from_rendered(&id),
        event_type,
        event_version,
        aggregate_type,
        aggregate_id,
        aggregate_sequence,
        occurred_at,
        trace_id,
        headers,
        payload,
    })
}

#[cfg(test)]
mod tests;
