//! Publishers: where the relay sends events.

use std::fmt::Display;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use event_core::EventEnvelope;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{Mutex, mpsc};

use crate::error::{BoxError, UnreadableRow};
use crate::row::outbox::OutboxRecord;

/// An event on its way to a broker: the envelope and where it goes.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxMessage {
    /// The envelope; `envelope.event_id` is the broker-side deduplication key.
    pub envelope: EventEnvelope,
    /// The publish channel, e.g. `MQ`.
    pub channel: String,
    /// The topic, exchange or subject.
    pub topic: Option<String>,
    /// The routing key.
    pub routing_key: Option<String>,
    /// Attempts before this one.
    pub retry_count: u32,
    /// The broker's deduplication id (JetStream's `Nats-Msg-Id`, AMQP's `message_id`): the event
    /// number, or for a republish the event number, `~republish-` and the republish's own id, so
    /// that the broker takes it even inside its duplicate window. Consumers deduplicate on the
    /// envelope's `eventId`, which never changes.
    pub message_id: String,
}

impl OutboxMessage {
    /// The message for a stored row.
    pub fn from_record(record: &OutboxRecord) -> Result<OutboxMessage, UnreadableRow> {
        Ok(OutboxMessage {
            envelope: record.envelope()?,
            channel: record.publish_channel.clone(),
            topic: record.topic.clone(),
            routing_key: record.routing_key.clone(),
            retry_count: u32::try_from(record.retry_count).unwrap_or(0),
            message_id: record.event_no.clone(),
        })
    }

    /// The message sent again by the republish `run` (any id that differs between republishes).
    pub fn republished(mut self, run: impl Display) -> OutboxMessage {
        self.message_id = format!("{}~republish-{run}", self.envelope.event_id);
        self
    }

    /// Whether this is a republish of an event published before.
    pub fn is_republish(&self) -> bool {
        self.message_id != self.envelope.event_id.as_str()
    }
}

/// Why publishing one message failed. The relay records [`PublishError::reason`] in the row's
/// `fail_reason`.
///
/// Two kinds, which the relay treats differently:
/// - a **rejection** ([`PublishError::new`], [`PublishError::with_source`]): the broker refused
///   this message (no stream or queue takes it, too large, a nack) or it cannot be sent at all.
///   It counts as a failed attempt of the event, retried with backoff up to its retry limit.
/// - an **outage** ([`PublishError::unavailable`]): the broker could not be reached or did not
///   answer in time, so nothing is known of the message. The event's attempt does not count: the
///   relay gives its lease back unchanged, pauses, and tries again as soon as the broker answers.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{context}")]
pub struct PublishError {
    context: String,
    reason: String,
    unavailable: bool,
    #[source]
    source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
}

impl PublishError {
    /// The broker refused the message, for the reason given.
    pub fn new(reason: impl Display) -> PublishError {
        let context = cut(reason.to_string());
        PublishError {
            reason: context.clone(),
            context,
            unavailable: false,
            source: None,
        }
    }

    /// The broker refused the message: `context` says what was being done, `source` is the
    /// broker client's error, kept as the error's source.
    pub fn with_source(context: impl Display, source: impl Into<BoxError>) -> PublishError {
        let source: BoxError = source.into();
        let context = cut(context.to_string());
        PublishError {
            reason: cut(format!("{context}: {source}")),
            context,
            unavailable: false,
            source: Some(Arc::from(source)),
        }
    }

    /// The broker was unreachable or did not answer in time (a lost connection, a timeout):
    /// not a failure of the event, which the relay publishes again once the broker answers.
    pub fn unavailable(context: impl Display, source: impl Into<BoxError>) -> PublishError {
        PublishError {
            unavailable: true,
            ..PublishError::with_source(context, source)
        }
    }

    /// Whether the broker was unavailable, rather than refusing this message.
    pub fn is_unavailable(&self) -> bool {
        self.unavailable
    }

    /// The reason as stored in `fail_reason`: the context and its cause, cut to 1000
    /// characters.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl PartialEq for PublishError {
    fn eq(&self, other: &Self) -> bool {
        self.reason == other.reason
    }
}

fn cut(text: String) -> String {
    if text.chars().count() <= 1000 {
        text
    } else {
        text.chars().take(1000).collect()
    }
}

/// Sends a batch of messages to a broker.
///
/// Returns one result per message, in order. The relay holds no database lock while this runs,
/// and an event is marked published only after its result is `Ok`: a publisher must return `Ok`
/// only once the broker has accepted the message (its ack or confirm).
///
/// Implement it with an `async fn`; a publisher that wraps another (to log, count, or route
/// some events elsewhere) awaits the inner one:
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use event_sqlx::{OutboxMessage, PublishError, Publisher};
///
/// struct Counting<P> { inner: P, failed: AtomicUsize }
///
/// impl<P: Publisher> Publisher for Counting<P> {
///     async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
///         let results = self.inner.publish(messages).await;
///         let failed = results.iter().filter(|r| r.is_err()).count();
///         self.failed.fetch_add(failed, Ordering::Relaxed);
///         results
///     }
/// }
///
/// let (channel, _received) = event_sqlx::ChannelPublisher::channel(100);
/// let publisher = Counting { inner: channel, failed: AtomicUsize::new(0) };
/// # let _ = publisher;
/// ```
pub trait Publisher: Send + Sync {
    /// Publishes `messages`; one result each, in order.
    fn publish<'a>(
        &'a self,
        messages: &'a [OutboxMessage],
    ) -> impl Future<Output = Vec<Result<(), PublishError>>> + Send + 'a;

    /// The broker, as OpenTelemetry's `messaging.system` names it (`nats`, `rabbitmq`,
    /// `kafka`), for the relay's [messaging spans](crate::telemetry); `unknown` by default.
    fn messaging_system(&self) -> &'static str {
        "unknown"
    }

    /// Where `message` goes on the broker (a subject, an exchange, a topic), OpenTelemetry's
    /// `messaging.destination.name`; by default its topic, or its event type in lowercase.
    fn destination(&self, message: &OutboxMessage) -> String {
        match &message.topic {
            Some(topic) => topic.clone(),
            None => message.envelope.event_type.to_ascii_lowercase(),
        }
    }
}

/// A shared publisher publishes as the publisher it points to: several relays in one process
/// can share one behind an `Arc`.
impl<P: Publisher + ?Sized> Publisher for Arc<P> {
    fn publish<'a>(
        &'a self,
        messages: &'a [OutboxMessage],
    ) -> impl Future<Output = Vec<Result<(), PublishError>>> + Send + 'a {
        (**self).publish(messages)
    }

    fn messaging_system(&self) -> &'static str {
        (**self).messaging_system()
    }

    fn destination(&self, message: &OutboxMessage) -> String {
        (**self).destination(message)
    }
}

/// Publishes into an in-process channel: for tests, and for consumers in the same process.
#[derive(Debug, Clone)]
pub struct ChannelPublisher {
    sender: mpsc::Sender<OutboxMessage>,
}

impl ChannelPublisher {
    /// A publisher and the receiving end of its channel, which holds up to `capacity` messages
    /// before publishing waits.
    pub fn channel(capacity: usize) -> (ChannelPublisher, mpsc::Receiver<OutboxMessage>) {
        let (sender, receiver) = mpsc::channel(capacity.max(1));
        (ChannelPublisher { sender }, receiver)
    }
}

impl Publisher for ChannelPublisher {
    async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        let mut results = Vec::with_capacity(messages.len());
        for message in messages {
            results.push(self.sender.send(message.clone()).await.map_err(|e| {
                PublishError::with_source("the receiving end of the channel was dropped", e)
            }));
        }
        results
    }
}

/// Writes each envelope as one line of JSON to stdout or a file. Clones write to the same
/// output, one batch at a time.
#[derive(Clone)]
pub struct JsonLinesPublisher {
    out: Arc<Mutex<Box<dyn AsyncWrite + Send + Unpin>>>,
}

impl std::fmt::Debug for JsonLinesPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonLinesPublisher").finish_non_exhaustive()
    }
}

impl JsonLinesPublisher {
    /// Writes to standard output.
    pub fn stdout() -> JsonLinesPublisher {
        JsonLinesPublisher::new(tokio::io::stdout())
    }

    /// Appends to the file at `path`, creating it.
    pub async fn append_to(path: impl AsRef<Path>) -> std::io::Result<JsonLinesPublisher> {
        let file = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .await?;
        Ok(JsonLinesPublisher::new(file))
    }

    /// Writes to `out`.
    pub fn new(out: impl AsyncWrite + Send + Unpin + 'static) -> JsonLinesPublisher {
        JsonLinesPublisher {
            out: Arc::new(Mutex::new(Box::new(out))),
        }
    }
}

impl Publisher for JsonLinesPublisher {
    async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        let mut out = self.out.lock().await;
        let mut results = Vec::with_capacity(messages.len());
        for message in messages {
            let result = match serde_json::to_vec(&message.envelope) {
                Ok(mut line) => {
                    line.push(b'\n');
                    out.write_all(&line)
                        .await
                        .map_err(|e| PublishError::with_source("cannot write the line", e))
                }
                Err(e) => Err(PublishError::with_source(
                    "cannot serialize the envelope",
                    e,
                )),
            };
            results.push(result);
        }
        // A line counts as published once it reached the file.
        if let Err(e) = out.flush().await {
            let error = PublishError::with_source("cannot flush the output", e);
            return messages.iter().map(|_| Err(error.clone())).collect();
        }
        results
    }
}
