//! Publishers: where the relay sends events.

use std::fmt::Display;
use std::future::Future;
use std::path::Path;

use event_core::EventEnvelope;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{Mutex, mpsc};

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
}

/// Why publishing one message failed. The relay records the reason and retries with backoff.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct PublishError {
    reason: String,
}

impl PublishError {
    /// A failure with a reason for the `fail_reason` column (cut to 1000 characters).
    pub fn new(reason: impl Display) -> PublishError {
        PublishError {
            reason: reason.to_string().chars().take(1000).collect(),
        }
    }

    /// The reason.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

/// Sends a batch of messages to a broker.
///
/// Returns one result per message, in order. The relay holds no database lock while this runs,
/// and an event is marked published only after its result is `Ok`: a publisher must return `Ok`
/// only once the broker has accepted the message (its ack or confirm).
pub trait Publisher: Send + Sync {
    /// Publishes `messages`; one result each, in order.
    fn publish<'a>(
        &'a self,
        messages: &'a [OutboxMessage],
    ) -> impl Future<Output = Vec<Result<(), PublishError>>> + Send + 'a;
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
            results.push(
                self.sender
                    .send(message.clone())
                    .await
                    .map_err(|_| PublishError::new("the receiving end of the channel was dropped")),
            );
        }
        results
    }
}

/// Writes each envelope as one line of JSON to stdout or a file.
pub struct JsonLinesPublisher {
    out: Mutex<Box<dyn AsyncWrite + Send + Unpin>>,
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
            out: Mutex::new(Box::new(out)),
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
                    out.write_all(&line).await.map_err(PublishError::new)
                }
                Err(e) => Err(PublishError::new(e)),
            };
            results.push(result);
        }
        // A line counts as published once it reached the file.
        if let Err(e) = out.flush().await {
            let error = PublishError::new(e);
            return messages.iter().map(|_| Err(error.clone())).collect();
        }
        results
    }
}
