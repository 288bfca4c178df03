//! NATS JetStream.

use std::time::Duration;

use async_nats::jetstream;

use super::{BrokerError, event_headers};
use crate::publisher::{OutboxMessage, PublishError, Publisher};

/// Publishes to NATS JetStream on the subject `<topic>.<routing_key>` (either alone when the other
/// is unset), with `Nats-Msg-Id` = event number, so that the stream drops a duplicate published
/// within its duplicate window, and waits for each publish acknowledgement.
///
/// A subject no stream captures, or a server that does not answer within the ack timeout, is a
/// failed publish: the relay retries it with backoff; the event is never lost.
#[derive(Debug, Clone)]
pub struct NatsPublisher {
    jetstream: jetstream::Context,
    address: String,
}

impl NatsPublisher {
    /// Connects to the NATS server at `address` (e.g. `nats://127.0.0.1:4222`).
    pub async fn connect(address: &str) -> Result<NatsPublisher, BrokerError> {
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(5))
            .connect(address)
            .await
            .map_err(|e| BrokerError::new("NATS", address, format!("cannot connect: {e}")))?;
        let mut jetstream = jetstream::new(client);
        jetstream.set_timeout(Duration::from_secs(10));
        Ok(NatsPublisher {
            jetstream,
            address: address.to_owned(),
        })
    }

    /// The JetStream context, to create streams and consumers.
    pub fn jetstream(&self) -> &jetstream::Context {
        &self.jetstream
    }

    /// Creates the stream `name` capturing `subjects` (e.g. `order.event.>`) unless it exists, with
    /// a two-minute duplicate window.
    pub async fn ensure_stream(
        &self,
        name: &str,
        subjects: Vec<String>,
    ) -> Result<(), BrokerError> {
        self.jetstream
            .get_or_create_stream(jetstream::stream::Config {
                name: name.to_owned(),
                subjects,
                duplicate_window: Duration::from_secs(120),
                ..Default::default()
            })
            .await
            .map_err(|e| {
                BrokerError::new(
                    "NATS",
                    &self.address,
                    format!("cannot create stream {name}: {e}"),
                )
            })?;
        Ok(())
    }

    /// The subject a message is published on.
    pub fn subject(message: &OutboxMessage) -> String {
        match (&message.topic, &message.routing_key) {
            (Some(topic), Some(key)) => format!("{topic}.{key}"),
            (Some(topic), None) => topic.clone(),
            (None, Some(key)) => key.clone(),
            (None, None) => message.envelope.event_type.to_ascii_lowercase(),
        }
    }
}

impl Publisher for NatsPublisher {
    async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        // Send every message first, then wait for the acks: one round trip's latency per batch.
        let mut pending = Vec::with_capacity(messages.len());
        for message in messages {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Nats-Msg-Id", message.envelope.event_id.as_str());
            for (name, value) in event_headers(message) {
                headers.insert(name, value.as_str());
            }
            let sent = match serde_json::to_vec(&message.envelope) {
                Ok(payload) => self
                    .jetstream
                    .publish_with_headers(Self::subject(message), headers, payload.into())
                    .await
                    .map_err(|e| PublishError::new(format!("NATS publish failed: {e}"))),
                Err(e) => Err(PublishError::new(e)),
            };
            pending.push(sent);
        }
        let mut results = Vec::with_capacity(messages.len());
        for sent in pending {
            results.push(match sent {
                Ok(ack) => ack.await.map(drop).map_err(|e| {
                    PublishError::new(format!("NATS did not acknowledge the publish: {e}"))
                }),
                Err(e) => Err(e),
            });
        }
        results
    }
}
