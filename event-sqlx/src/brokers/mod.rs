//! Layer 5: publishers and subscriptions on real brokers, behind cargo features: NATS JetStream
//! (`nats`), RabbitMQ (`rabbitmq`) and Kafka (`kafka`). Each sends the envelope's JSON, the same shape on every transport, with the
//! event number as the broker's deduplication id and the event's metadata as headers.

#[cfg(feature = "kafka")]
mod kafka;
#[cfg(feature = "nats")]
mod nats;
#[cfg(feature = "rabbitmq")]
mod rabbitmq;

#[cfg(feature = "kafka")]
pub use kafka::{KafkaPublisher, KafkaSubscription};
#[cfg(feature = "nats")]
pub use nats::{JetStreamSubscription, NatsPublisher};

/// A broker's URL: kept whole to connect with, shown (`Display`, `Debug`, errors, logs) with its
/// password as `***`.
#[derive(Clone, PartialEq, Eq)]
#[allow(dead_code)] // used by whichever broker features are on
pub(crate) struct Address(String);

#[allow(dead_code)] // used by whichever broker features are on
impl Address {
    pub(crate) fn new(url: &str) -> Address {
        Address(url.to_owned())
    }

    /// The whole URL, password included: only to connect with.
    pub(crate) fn url(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::error::redact_url(&self.0))
    }
}

impl std::fmt::Debug for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", crate::error::redact_url(&self.0))
    }
}

/// How soon a subscription tries again a message that arrived before its aggregate's previous
/// sequence was applied.
#[allow(dead_code)] // used by whichever broker features are on
pub(crate) const EARLY_RETRY: std::time::Duration = std::time::Duration::from_millis(250);

/// `size` within 1..=`max`, saying so when it is not: a subscription's `.batch(n)`.
#[allow(dead_code)] // used by whichever broker features are on
pub(crate) fn batch_size(broker: &str, size: usize, max: usize) -> usize {
    let clamped = size.clamp(1, max);
    if clamped != size {
        tracing::warn!(
            broker,
            asked = size,
            used = clamped,
            "batch size out of range (1 to {max}); using {clamped}"
        );
    }
    clamped
}

/// What a subscription processed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConsumeReport {
    /// Applied and committed.
    pub applied: usize,
    /// Already consumed.
    pub duplicates: usize,
    /// Not for this consumer.
    pub ignored: usize,
    /// Quarantined (including stale events refused by the per-aggregate guard).
    pub quarantined: usize,
    /// Given back to the broker because they arrived before their aggregate's previous
    /// sequence was applied; counted each time.
    pub early: usize,
}

impl ConsumeReport {
    #[allow(dead_code)] // used by whichever broker features are on
    pub(crate) fn count(&mut self, outcome: &crate::consumer::Processed) {
        match outcome {
            crate::consumer::Processed::Applied => self.applied += 1,
            crate::consumer::Processed::Duplicate => self.duplicates += 1,
            crate::consumer::Processed::Ignored => self.ignored += 1,
            crate::consumer::Processed::Quarantined(_) | crate::consumer::Processed::Stale => {
                self.quarantined += 1
            }
            crate::consumer::Processed::Early { .. } => self.early += 1,
        }
    }
}
#[cfg(feature = "rabbitmq")]
pub use rabbitmq::{RabbitMqPublisher, RabbitMqSubscription};

use crate::publisher::OutboxMessage;

/// Each message's result, where a message with none (the batch's deadline passed before the
/// broker answered for it) gets `missing`: an outage.
#[allow(dead_code)] // used by whichever broker features are on
pub(crate) fn settle(
    results: Vec<Option<Result<(), crate::publisher::PublishError>>>,
    missing: impl Fn() -> crate::publisher::PublishError,
) -> Vec<Result<(), crate::publisher::PublishError>> {
    results
        .into_iter()
        .map(|result| result.unwrap_or_else(|| Err(missing())))
        .collect()
}

/// The message body every transport sends: the envelope's JSON, or the publish failure of a
/// message that cannot be serialized.
#[allow(dead_code)] // used by whichever broker features are on
pub(crate) fn payload(message: &OutboxMessage) -> Result<Vec<u8>, crate::publisher::PublishError> {
    serde_json::to_vec(&message.envelope).map_err(|e| {
        crate::publisher::PublishError::with_source("cannot serialize the envelope", e)
    })
}

/// How a broker's binding carries CloudEvents attributes in binary mode.
#[allow(dead_code)] // used by whichever broker features are on
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Binding {
    /// `ce_` headers, `content-type` header.
    Kafka,
    /// `ce-` headers, the `content_type` property.
    Amqp,
    /// `ce-` headers percent-encoded as on HTTP, `content-type` header.
    Nats,
}

/// A message as a publisher sends it: body, headers (besides the broker's own deduplication
/// id) and, on AMQP, the `content_type` property.
#[allow(dead_code)] // used by whichever broker features are on
pub(crate) struct Outbound {
    pub(crate) body: Vec<u8>,
    pub(crate) headers: Vec<(std::borrow::Cow<'static, str>, String)>,
    pub(crate) content_type: Option<&'static str>,
}

/// `message` in `format`, as `binding` carries it; the publish failure of a message that
/// cannot be serialized.
#[allow(dead_code)] // used by whichever broker features are on
pub(crate) fn outbound(
    message: &OutboxMessage,
    format: crate::wire::WireFormat,
    binding: Binding,
) -> Result<Outbound, crate::publisher::PublishError> {
    use crate::wire::{JSON, STRUCTURED, WireFormat};
    let fail = |e| crate::publisher::PublishError::with_source("cannot serialize the event", e);
    let envelope = &message.envelope;
    let header = |content_type: &str| match binding {
        Binding::Amqp => None,
        Binding::Kafka | Binding::Nats => Some(("content-type".into(), content_type.to_owned())),
    };
    let traceparent = envelope
        .headers
        .traceparent
        .as_ref()
        .map(|t| ("traceparent".into(), t.clone()));
    Ok(match format {
        WireFormat::Envelope => Outbound {
            body: payload(message)?,
            headers: event_headers(message)
                .into_iter()
                .map(|(name, value)| (name.into(), value))
                .collect(),
            content_type: (binding == Binding::Amqp).then_some(JSON),
        },
        WireFormat::CloudEventsBinary => {
            let prefix = if binding == Binding::Kafka {
                "ce_"
            } else {
                "ce-"
            };
            let mut headers: Vec<(std::borrow::Cow<'static, str>, String)> =
                crate::wire::attributes(envelope)
                    .into_iter()
                    .map(|(name, value)| {
                        let value = match binding {
                            Binding::Nats => crate::wire::percent_encode(&value).into_owned(),
                            Binding::Kafka | Binding::Amqp => value,
                        };
                        (format!("{prefix}{name}").into(), value)
                    })
                    .collect();
            headers.extend(header(JSON));
            headers.extend(traceparent);
            Outbound {
                body: serde_json::to_vec(&envelope.payload).map_err(fail)?,
                headers,
                content_type: Some(JSON),
            }
        }
        WireFormat::CloudEventsStructured => {
            let content_type = match binding {
                Binding::Amqp => STRUCTURED,
                Binding::Kafka | Binding::Nats => "application/cloudevents+json; charset=UTF-8",
            };
            Outbound {
                body: crate::wire::structured(envelope).map_err(fail)?,
                headers: header(content_type)
                    .into_iter()
                    .chain(traceparent)
                    .collect(),
                content_type: Some(content_type),
            }
        }
    })
}

/// A received message's binary-mode attributes: the headers named one of `prefixes` (any case)
/// and an attribute, names lowercased without the prefix, values as `read` reads them. Only
/// those headers' values are read: an envelope's headers cost a prefix comparison each.
#[allow(dead_code)] // used by whichever broker features are on
pub(crate) fn ce_attributes<'h, V>(
    headers: impl IntoIterator<Item = (&'h str, V)>,
    prefixes: &[&str],
    read: impl Fn(V) -> Option<String>,
) -> Vec<(String, String)> {
    let attribute = |name: &'h str| {
        prefixes.iter().find_map(|p| {
            let head = name.get(..p.len())?;
            let rest = &name[p.len()..];
            (head.eq_ignore_ascii_case(p) && !rest.is_empty()).then_some(rest)
        })
    };
    headers
        .into_iter()
        .filter_map(|(name, value)| {
            let attribute = attribute(name)?;
            Some((attribute.to_ascii_lowercase(), read(value)?))
        })
        .collect()
}

/// The headers every transport carries, besides the broker's own deduplication id.
#[allow(dead_code)] // used by whichever broker features are on
pub(crate) fn event_headers(message: &OutboxMessage) -> Vec<(&'static str, String)> {
    let e = &message.envelope;
    let mut headers = vec![
        ("eventId", e.event_id.to_string()),
        ("eventType", e.event_type.clone()),
        ("eventVersion", e.event_version.to_string()),
        ("aggregateType", e.aggregate_type.clone()),
        ("aggregateId", e.aggregate_id.clone()),
        ("aggregateSequence", e.aggregate_sequence.to_string()),
    ];
    if let Some(traceparent) = &e.headers.traceparent {
        headers.push(("traceparent", traceparent.clone()));
    }
    headers
}

/// Processes one batch of broker messages with `consumer` ([`Consumer::receive_batch`]) and
/// counts the outcomes in `report`; `inbound` reads each message's body and what a CloudEvent
/// needs of its headers (any wire format is read), `id` its broker id.
/// Returns, per message, whether it came early: give those back, acknowledge the others. On
/// `Err`, acknowledge none of them.
///
/// [`Consumer::receive_batch`]: crate::consumer::Consumer::receive_batch
#[allow(dead_code)] // used by whichever broker features are on
pub(crate) async fn receive_batch<DB, R, M>(
    consumer: &crate::consumer::Consumer<DB, R>,
    messages: &[M],
    source: Source<'_, M>,
    report: &mut ConsumeReport,
) -> Result<Vec<bool>, crate::error::Error>
where
    DB: crate::sql::dialect::Backend,
    R: crate::route::Routes<DB>,
{
    use crate::wire::Decoded;
    let ids: Vec<Option<String>> = messages.iter().map(source.id).collect();
    let now = consumer.now();
    let decoded: Vec<(&[u8], Decoded<'_>)> = messages
        .iter()
        .map(|m| {
            let inbound = (source.inbound)(m);
            (inbound.body, inbound.decode(now))
        })
        .collect();
    let spans = if consumer.has_messaging_spans() {
        process_spans(messages, &decoded, &source)
    } else {
        Vec::new()
    };
    let mut outcomes: Vec<Option<crate::consumer::Processed>> = vec![None; messages.len()];
    let mut received = Vec::with_capacity(messages.len());
    let mut at = Vec::with_capacity(messages.len());
    for (i, ((raw, decoded), id)) in decoded.iter().zip(&ids).enumerate() {
        let body: &[u8] = match decoded {
            Decoded::Envelope(body) => body,
            Decoded::CloudEvent(json) => json,
            Decoded::Invalid(reason) => {
                let processed = consumer
                    .quarantine_unreadable(id.as_deref(), raw, reason.clone())
                    .await?;
                outcomes[i] = Some(processed);
                continue;
            }
        };
        received.push(crate::consumer::Received {
            body,
            message_id: id.as_deref(),
        });
        at.push(i);
    }
    if !received.is_empty() {
        let processed = consumer.receive_batch(&received).await;
        if let Err(e) = &processed {
            for span in &spans {
                span.record(
                    "error.type",
                    if e.is_transient() {
                        "unavailable"
                    } else {
                        "failed"
                    },
                );
            }
        }
        for (i, outcome) in at.into_iter().zip(processed?) {
            outcomes[i] = Some(outcome);
        }
    }
    let outcomes: Vec<crate::consumer::Processed> = outcomes.into_iter().flatten().collect();
    for outcome in &outcomes {
        report.count(outcome);
    }
    Ok(outcomes
        .iter()
        .map(|outcome| matches!(outcome, crate::consumer::Processed::Early { .. }))
        .collect())
}

/// How [`receive_batch`] reads a broker's messages.
#[allow(dead_code)] // used by whichever broker features are on
pub(crate) struct Source<'f, M> {
    /// OpenTelemetry's `messaging.system`: `nats`, `rabbitmq`, `kafka`.
    pub(crate) system: &'static str,
    /// The body and what a CloudEvent needs of the headers.
    pub(crate) inbound: &'f (dyn Fn(&M) -> crate::wire::Inbound<'_> + Sync),
    /// The broker's id of the message.
    pub(crate) id: &'f (dyn Fn(&M) -> Option<String> + Sync),
    /// Where the message came from (subject, exchange, topic).
    pub(crate) destination: &'f (dyn Fn(&M) -> String + Sync),
}

/// A `process` span for each message of a batch, in the trace of its `traceparent`.
#[allow(dead_code)] // used by whichever broker features are on
fn process_spans<M>(
    messages: &[M],
    decoded: &[(&[u8], crate::wire::Decoded<'_>)],
    source: &Source<'_, M>,
) -> Vec<tracing::Span> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Traced {
        event_id: String,
        #[serde(default)]
        headers: TracedHeaders,
    }
    #[derive(Default, serde::Deserialize)]
    struct TracedHeaders {
        traceparent: Option<String>,
    }
    messages
        .iter()
        .zip(decoded)
        .map(|(m, (_, decoded))| {
            let body: &[u8] = match decoded {
                crate::wire::Decoded::Envelope(body) => body,
                crate::wire::Decoded::CloudEvent(json) => json,
                crate::wire::Decoded::Invalid(_) => &[],
            };
            let traced: Option<Traced> = serde_json::from_slice(body).ok();
            let id = traced.as_ref().map_or("", |t| t.event_id.as_str());
            let traceparent = traced
                .as_ref()
                .and_then(|t| t.headers.traceparent.as_deref());
            let destination = (source.destination)(m);
            let operation = crate::telemetry::Operation::Process;
            crate::telemetry::span(operation, source.system, &destination, id, traceparent)
        })
        .collect()
}

/// A subscription that can drain: what [`run_until`] loops over.
#[allow(dead_code)] // used by whichever broker features are on
pub(crate) trait Drain {
    /// Processes messages until none arrives for `idle`, adding what it did to `report` (also
    /// when it ends in an error).
    #[allow(dead_code)] // used by whichever broker features are on
    async fn drain_once<DB: crate::sql::dialect::Backend, R: crate::route::Routes<DB>>(
        &self,
        consumer: &crate::consumer::Consumer<DB, R>,
        idle: std::time::Duration,
        report: &mut ConsumeReport,
    ) -> Result<(), crate::error::Error>;
}

/// Drains again and again until `shutdown` completes, finishing the drain in hand first. A
/// loop over a trait, not a closure, so that its future is `Send` for every lifetime of the
/// consumer and a subscription can run in a spawned task.
#[allow(dead_code)] // used by whichever broker features are on
pub(crate) async fn run_until<S, DB, R>(
    subscription: &S,
    consumer: &crate::consumer::Consumer<DB, R>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<ConsumeReport, crate::error::Error>
where
    S: Drain,
    DB: crate::sql::dialect::Backend,
    R: crate::route::Routes<DB>,
{
    const PAUSE: std::time::Duration = std::time::Duration::from_millis(250);
    const MAX_PAUSE: std::time::Duration = std::time::Duration::from_secs(5);
    let mut total = ConsumeReport::default();
    let mut pause = PAUSE;
    tokio::pin!(shutdown);
    loop {
        match subscription
            .drain_once(consumer, std::time::Duration::from_millis(500), &mut total)
            .await
        {
            Ok(()) => pause = PAUSE,
            // The database or the broker is down or dropped the connection: what was in hand
            // goes back to the broker; pause, then go on.
            Err(e) if e.is_transient() => {
                let what = match e {
                    crate::error::Error::Broker { .. }
                    | crate::error::Error::BrokerUnavailable { .. } => "the broker",
                    _ => "the database",
                };
                tracing::warn!(consumer = consumer.name(), error = %crate::error::Chain(&e), pause = ?pause, "consumer paused: {what} is unavailable");
                tokio::select! {
                    biased;
                    () = &mut shutdown => return Ok(total),
                    () = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(MAX_PAUSE);
                continue;
            }
            Err(e) => return Err(e),
        }
        // Entries an operator requeued since the last loop; a database error here does not
        // stop the subscription, the next loop tries again.
        if let Err(e) = consumer.replay_requeued().await {
            tracing::warn!(consumer = consumer.name(), error = %crate::error::Chain(&e), "could not replay requeued quarantine entries");
        }
        tokio::select! {
            biased;
            () = &mut shutdown => return Ok(total),
            () = std::future::ready(()) => {}
        }
    }
}
