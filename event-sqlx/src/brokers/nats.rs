//! NATS JetStream.

use std::time::Duration;

use async_nats::jetstream;

use super::Binding;
use crate::consumer::Consumer;
use crate::error::{BoxError, Error};
use crate::publisher::{OutboxMessage, PublishError, Publisher};
use crate::route::Routes;
use crate::sql::dialect::Backend;
use crate::wire::{Inbound, WireFormat, percent_decode};

/// Publishes to NATS JetStream on the subject `<topic>.<routing_key>` (either alone when the other
/// is unset), with `Nats-Msg-Id` = event number, so that the stream drops a duplicate published
/// within its duplicate window, and waits for each publish acknowledgement.
///
/// The partition key is the aggregate id, the seed's ordering scope: it travels in the
/// `aggregateId` header, and with [`NatsPublisher::subject_per_aggregate`] as the subject's last
/// token, which a stream's subject mapping (`partition(n, ...)`) can partition on.
///
/// A subject no stream captures, or a message the stream refuses, is a failed publish of that
/// event, retried with backoff. A server that does not acknowledge a batch within the ack
/// timeout, or a lost connection, is an outage ([`PublishError::unavailable`]): the relay pauses
/// and publishes the batch again once the server answers, without counting it against the
/// events. The client reconnects by itself.
#[derive(Debug, Clone)]
pub struct NatsPublisher {
    /// Shared by clones; behind an `Arc`, so that a publisher stays small to move.
    jetstream: std::sync::Arc<jetstream::Context>,
    address: super::Address,
    per_aggregate: bool,
    ack_timeout: Duration,
    format: WireFormat,
}

impl NatsPublisher {
    /// Connects to the NATS server at `address` (e.g. `nats://127.0.0.1:4222`).
    pub async fn connect(address: &str) -> Result<NatsPublisher, Error> {
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(5))
            .connect(address)
            .await
            .map_err(|e| Error::broker("NATS", address, "cannot connect", e))?;
        let mut jetstream = jetstream::new(client);
        jetstream.set_timeout(DEFAULT_ACK_TIMEOUT);
        Ok(NatsPublisher {
            jetstream: std::sync::Arc::new(jetstream),
            address: crate::brokers::Address::new(address),
            per_aggregate: false,
            ack_timeout: DEFAULT_ACK_TIMEOUT,
            format: WireFormat::Envelope,
        })
    }

    /// How long one window of a batch (up to 500 messages, sent together) may take, from the
    /// first send to the last acknowledgement: 10 s by default. The acknowledgements are awaited
    /// together, so a batch whose acks are lost fails after this long, not this long per
    /// message; what is not acknowledged by then is an outage ([`PublishError::unavailable`]).
    pub fn ack_timeout(mut self, timeout: Duration) -> NatsPublisher {
        std::sync::Arc::make_mut(&mut self.jetstream).set_timeout(timeout);
        self.ack_timeout = timeout;
        self
    }

    /// Publishes in `format`: this toolkit's envelope (the default) or a CloudEvent in binary
    /// mode (`ce-` headers, percent-encoded as on HTTP) or structured mode (see
    /// [`WireFormat`]). Subscriptions read every format.
    pub fn wire_format(mut self, format: WireFormat) -> NatsPublisher {
        self.format = format;
        self
    }

    /// The JetStream context, to create streams and consumers.
    pub fn jetstream(&self) -> &jetstream::Context {
        &self.jetstream
    }

    /// Creates the stream `name` capturing `subjects` (e.g. `order.event.>`) unless it exists, with
    /// a two-minute duplicate window.
    pub async fn ensure_stream(&self, name: &str, subjects: Vec<String>) -> Result<(), Error> {
        self.jetstream
            .get_or_create_stream(jetstream::stream::Config {
                name: name.to_owned(),
                subjects,
                duplicate_window: Duration::from_secs(120),
                ..Default::default()
            })
            .await
            .map_err(|e| {
                Error::broker(
                    "NATS",
                    self.address.url(),
                    format!("cannot create stream {name}"),
                    e,
                )
            })?;
        Ok(())
    }

    /// Appends the aggregate id to each subject as its last token, `<topic>.<routing
    /// key>.<aggregate id>`, so that a stream can partition on it and order per aggregate holds
    /// within a partition. Characters a subject token cannot hold (`.`, `*`, `>`, whitespace)
    /// become `_`. Subscribers then filter on `<topic>.<routing key>.*` or `<topic>.>`.
    pub fn subject_per_aggregate(mut self, on: bool) -> NatsPublisher {
        self.per_aggregate = on;
        self
    }

    /// The subject a message is published on.
    pub fn subject(&self, message: &OutboxMessage) -> String {
        let mut subject = match (&message.topic, &message.routing_key) {
            (Some(topic), Some(key)) => format!("{topic}.{key}"),
            (Some(topic), None) => topic.clone(),
            (None, Some(key)) => key.clone(),
            (None, None) => message.envelope.event_type.to_ascii_lowercase(),
        };
        if self.per_aggregate {
            subject.push('.');
            subject.extend(message.envelope.aggregate_id.chars().map(|c| {
                if c == '.' || c == '*' || c == '>' || c.is_whitespace() {
                    '_'
                } else {
                    c
                }
            }));
            if message.envelope.aggregate_id.is_empty() {
                subject.push('_');
            }
        }
        subject
    }
}

/// The ack timeout unless [`NatsPublisher::ack_timeout`] sets another.
const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(10);

/// Publishes in flight at most per window: the client holds at most 5000 unacknowledged
/// publishes per context, and relays sharing one publisher must stay under that together.
const ACK_WINDOW: usize = 500;

impl Publisher for NatsPublisher {
    async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        let mut results = Vec::with_capacity(messages.len());
        for window in messages.chunks(ACK_WINDOW) {
            results.extend(self.publish_window(window).await);
        }
        results
    }

    fn messaging_system(&self) -> &'static str {
        "nats"
    }

    fn destination(&self, message: &OutboxMessage) -> String {
        self.subject(message)
    }
}

impl NatsPublisher {
    async fn publish_window(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        use futures_util::StreamExt;
        use futures_util::stream::FuturesUnordered;
        // Send every message first, then wait for all the acks at once: one round trip's
        // latency per window, and one deadline for all of it, sends included (a client cut off
        // from its server queues sends until its buffer is full, then waits).
        let mut results: Vec<Option<Result<(), PublishError>>> = vec![None; messages.len()];
        let work = async {
            let mut acks = FuturesUnordered::new();
            for (at, message) in messages.iter().enumerate() {
                let outbound = match super::outbound(message, self.format, Binding::Nats) {
                    Ok(outbound) => outbound,
                    Err(e) => {
                        results[at] = Some(Err(e));
                        continue;
                    }
                };
                let mut headers = async_nats::HeaderMap::new();
                headers.insert("Nats-Msg-Id", message.message_id.as_str());
                for (name, value) in &outbound.headers {
                    headers.insert(name.as_ref(), value.as_str());
                }
                let payload = outbound.body;
                match self
                    .jetstream
                    .publish_with_headers(self.subject(message), headers, payload.into())
                    .await
                {
                    Ok(ack) => acks.push(async move { (at, ack.await) }),
                    Err(e) => results[at] = Some(Err(publish_failure("NATS publish failed", e))),
                }
            }
            while let Some((at, ack)) = acks.next().await {
                let message = &messages[at];
                results[at] = Some(match ack {
                    // A republish carries an id of its own: if the stream still calls it a
                    // duplicate, nobody will receive it.
                    Ok(ack) if ack.duplicate && message.is_republish() => {
                        Err(PublishError::new(format!(
                            "JetStream dropped republished {} as a duplicate of message id {} inside the stream's duplicate window",
                            message.envelope.event_id, message.message_id
                        )))
                    }
                    Ok(_) => Ok(()),
                    Err(e) => Err(publish_failure("NATS did not acknowledge the publish", e)),
                });
            }
        };
        let _ = tokio::time::timeout(self.ack_timeout, work).await;
        super::settle(results, || {
            PublishError::unavailable(
                format!(
                    "NATS did not acknowledge the batch within {} s (ack timeout)",
                    self.ack_timeout.as_secs_f64()
                ),
                "no acknowledgement",
            )
        })
    }
}

/// A failed JetStream publish: an outage when the server is not reachable or did not answer,
/// a rejection of the message otherwise (no stream for the subject, too large, ...).
fn publish_failure(context: &str, e: jetstream::context::PublishError) -> PublishError {
    use jetstream::context::PublishErrorKind as Kind;
    match e.kind() {
        Kind::TimedOut | Kind::BrokenPipe | Kind::MaxAckPending => {
            PublishError::unavailable(context, e)
        }
        _ => PublishError::with_source(context, e),
    }
}

/// A durable JetStream pull consumer feeding a [`Consumer`](crate::Consumer): each message is
/// acknowledged only after it was processed (applied and committed, a duplicate, ignored, or
/// quarantined). A message whose processing stopped the consumer is not acknowledged, so
/// JetStream delivers it again after the fix; so is one whose process died before its ack, and
/// the inbox turns that redelivery into a duplicate.
///
/// The subscription keeps one pull stream open from its first drain until it is dropped, so a
/// message delivered to it is processed in the order it arrived, however slow the handlers: none
/// is dropped when a pull request expires and then redelivered after the ack wait, behind newer
/// messages of its aggregate. A message that arrives before its aggregate's previous sequence
/// was applied ([`Processed::Early`](crate::Processed::Early)) is given back with a nak that
/// JetStream honours after a short delay. Dropping the subscription gives back at once what its
/// pull stream had received and no drain processed.
pub struct JetStreamSubscription {
    consumer: jetstream::consumer::PullConsumer,
    batch: usize,
    messages: tokio::sync::Mutex<Option<jetstream::consumer::pull::Stream>>,
}

impl std::fmt::Debug for JetStreamSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStreamSubscription")
            .field("batch", &self.batch)
            .finish_non_exhaustive()
    }
}

impl JetStreamSubscription {
    /// [`JetStreamSubscription::durable`] on a connection of its own to `url`
    /// (`nats://host:port`): for a service that only consumes. The stream must exist (the
    /// relay's side creates it).
    pub async fn connect(
        url: &str,
        stream: &str,
        durable: &str,
        filter_subject: &str,
        ack_wait: Duration,
    ) -> Result<JetStreamSubscription, Error> {
        let connection = NatsPublisher::connect(url).await?;
        Self::durable(&connection, stream, durable, filter_subject, ack_wait).await
    }

    /// The durable consumer `durable` on `stream`, receiving `filter_subject` (e.g.
    /// `order.event.>`), created if missing. `ack_wait` is how long JetStream waits for an ack
    /// before delivering again. It shares the connection of `publisher`;
    /// [`JetStreamSubscription::connect`] opens one of its own.
    pub async fn durable(
        publisher: &NatsPublisher,
        stream: &str,
        durable: &str,
        filter_subject: &str,
        ack_wait: Duration,
    ) -> Result<JetStreamSubscription, Error> {
        let fail = |e: BoxError| {
            Error::broker(
                "NATS",
                publisher.address.url(),
                format!("cannot set up consumer {durable} on {stream}"),
                e,
            )
        };
        let stream = publisher
            .jetstream
            .get_stream(stream)
            .await
            .map_err(|e| fail(e.into()))?;
        let consumer = stream
            .get_or_create_consumer(
                durable,
                jetstream::consumer::pull::Config {
                    durable_name: Some(durable.to_owned()),
                    filter_subject: filter_subject.to_owned(),
                    ack_policy: jetstream::consumer::AckPolicy::Explicit,
                    ack_wait,
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| fail(e.into()))?;
        Ok(JetStreamSubscription {
            consumer,
            batch: 1,
            messages: tokio::sync::Mutex::new(None),
        })
    }

    /// Applies up to `size` messages in one database transaction (see
    /// [`Consumer::receive_batch`]): what has arrived is taken at once, up to `size`, without
    /// waiting for a batch to fill, so a quiet stream is consumed with no added latency and a
    /// busy one in batches. 1, the default, is one transaction per message. Keep `size` well
    /// under the consumer's `max_ack_pending` (1000 by default). At most 1000: a size out of
    /// range is clamped, with a warning.
    pub fn batch(mut self, size: usize) -> JetStreamSubscription {
        self.batch = super::batch_size("JetStream", size, 1000);
        self
    }

    /// Processes messages until `shutdown` completes (the message in hand is finished first),
    /// and reports what it did. While the database is unavailable it pauses (250 ms, doubling up to
    /// 5 s) and goes on; a consumer that must stop (a bug, a broker failure) returns the error.
    pub async fn run<DB: Backend, R: Routes<DB>>(
        &self,
        consumer: &Consumer<DB, R>,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<super::ConsumeReport, Error> {
        super::run_until(self, consumer, shutdown).await
    }

    /// Processes messages until none arrives for `idle`, and reports what it did.
    ///
    /// The first drain opens the subscription's pull stream, which asks for up to a batch's
    /// worth of messages (at least 100) at a time and asks for more as they are processed; it
    /// stays open between drains, so messages that arrive after one drain ends wait for the next
    /// in order, not for the ack wait. Each message is processed as soon as it arrives, together
    /// with whatever arrived with it (up to the batch size), so a message never waits for a
    /// batch to fill. A chunk whose processing stops the consumer is given back at once (a
    /// nak), not left for the ack wait.
    pub async fn drain<DB: Backend, R: Routes<DB>>(
        &self,
        consumer: &Consumer<DB, R>,
        idle: Duration,
    ) -> Result<super::ConsumeReport, Error> {
        let mut report = super::ConsumeReport::default();
        self.drain_into(consumer, idle, &mut report).await?;
        Ok(report)
    }

    /// [`Self::drain`], adding what it did to `report` as it goes, so that a drain that ends in
    /// an error still counts what it applied before.
    async fn drain_into<DB: Backend, R: Routes<DB>>(
        &self,
        consumer: &Consumer<DB, R>,
        idle: Duration,
        report: &mut super::ConsumeReport,
    ) -> Result<(), Error> {
        use futures_util::{FutureExt, StreamExt};
        let stopped = |e: BoxError| Error::stopped(consumer.name(), "JetStream failed", e);
        let mut guard = self.messages.lock().await;
        if guard.is_none() {
            *guard = Some(
                self.consumer
                    .stream()
                    .max_messages_per_batch(self.batch.max(100))
                    .messages()
                    .await
                    .map_err(|e| stopped(e.into()))?,
            );
        }
        let Some(messages) = guard.as_mut() else {
            unreachable!("the pull stream was just opened")
        };
        let mut holding = None;
        loop {
            let next = match messages.next().now_or_never() {
                Some(next) => Ok(next),
                None => {
                    // Nothing waiting: the consumer's connection goes back to the pool while
                    // the stream is quiet.
                    holding = None;
                    tokio::time::timeout(idle, messages.next()).await
                }
            };
            let first = match next {
                Err(_) => return Ok(()),
                Ok(None) => {
                    *guard = None;
                    return Err(stopped("the pull stream ended".into()));
                }
                Ok(Some(Err(e)))
                    if e.kind()
                        == jetstream::consumer::pull::MessagesErrorKind::MissingHeartbeat =>
                {
                    // The link to the server is down or slow; the client reconnects and the
                    // stream goes on.
                    tracing::debug!(consumer = consumer.name(), "JetStream heartbeat missed");
                    continue;
                }
                Ok(Some(Err(e))) => {
                    *guard = None;
                    return Err(stopped(e.into()));
                }
                Ok(Some(Ok(message))) => message,
            };
            // The first message of a chunk is awaited; the rest are those already here.
            let mut chunk = vec![first];
            while chunk.len() < self.batch {
                match messages.next().now_or_never() {
                    Some(Some(Ok(message))) => chunk.push(message),
                    _ => break,
                }
            }
            let source = super::Source {
                system: "nats",
                inbound: &inbound,
                id: &|m: &jetstream::Message| {
                    m.headers
                        .as_ref()
                        .and_then(|h| h.get("Nats-Msg-Id"))
                        .map(|v| v.as_str().to_owned())
                },
                destination: &|m: &jetstream::Message| m.subject.to_string(),
            };
            holding.get_or_insert_with(|| consumer.hold_connection());
            let processed = super::receive_batch(consumer, &chunk, source, report).await;
            let early = match processed {
                Ok(early) => early,
                Err(stop) => {
                    for message in &chunk {
                        let _ = message.ack_with(jetstream::AckKind::Nak(None)).await;
                    }
                    return Err(stop);
                }
            };
            for (message, early) in chunk.iter().zip(early) {
                if early {
                    // Its aggregate's previous sequence is not applied yet: delivered again
                    // a little later, while the others go on.
                    message
                        .ack_with(jetstream::AckKind::Nak(Some(super::EARLY_RETRY)))
                        .await
                        .map_err(&stopped)?;
                } else {
                    message.ack().await.map_err(&stopped)?;
                }
            }
        }
    }
}

impl super::Drain for JetStreamSubscription {
    async fn drain_once<DB: Backend, R: Routes<DB>>(
        &self,
        consumer: &Consumer<DB, R>,
        idle: std::time::Duration,
        report: &mut crate::brokers::ConsumeReport,
    ) -> Result<(), Error> {
        self.drain_into(consumer, idle, report).await
    }
}

impl Drop for JetStreamSubscription {
    /// Gives back at once (a nak) the messages the pull stream had received and no drain
    /// processed, so that another consumer gets them now, not after the ack wait.
    fn drop(&mut self) {
        use futures_util::StreamExt;
        let Some(mut messages) = self.messages.get_mut().take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            // What is buffered comes at once; the stream then stays quiet.
            let quiet = Duration::from_millis(100);
            while let Ok(Some(Ok(message))) = tokio::time::timeout(quiet, messages.next()).await {
                let _ = message.ack_with(jetstream::AckKind::Nak(None)).await;
            }
        });
    }
}

/// What a CloudEvent needs of a JetStream message: its payload, `content-type` and the
/// attributes of its `ce-` headers, percent-decoded.
fn inbound(m: &jetstream::Message) -> Inbound<'_> {
    let headers = m.headers.as_ref();
    Inbound {
        body: &m.payload,
        content_type: headers.and_then(|h| {
            h.iter()
                .find(|(name, _)| AsRef::<str>::as_ref(*name).eq_ignore_ascii_case("content-type"))
                .and_then(|(_, values)| values.first())
                .map(|v| v.as_str().to_owned())
        }),
        attributes: headers
            .map(|h| {
                let values = h.iter().map(|(name, values)| (name.as_ref(), values));
                super::ce_attributes(values, &["ce-"], |values| {
                    values.first().map(|v| percent_decode(v.as_str()))
                })
            })
            .unwrap_or_default(),
    }
}
