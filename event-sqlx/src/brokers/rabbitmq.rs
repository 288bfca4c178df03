//! RabbitMQ.

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind,
};

use super::event_headers;

/// Unacknowledged deliveries a subscription holds at most.
const PREFETCH: u16 = 1000;
use crate::consumer::Consumer;
use crate::error::Error;
use crate::publisher::{OutboxMessage, PublishError, Publisher};
use crate::route::Routes;
use crate::sql::dialect::Backend;

/// Publishes to RabbitMQ with publisher confirms: exchange = the row's topic, routing key = its
/// routing key, persistent messages, `message_id` = event number, `application/json`.
///
/// Messages are published `mandatory`: one that no queue receives comes back, and counts as a
/// failed publish (retried with backoff), never as delivered.
///
/// The partition key is the aggregate id, the seed's ordering scope, in the `aggregateId`
/// header: bind queues through a consistent-hash exchange with `hash-header = aggregateId` to
/// spread aggregates over queues while each aggregate keeps to one queue, and so its order.
///
/// Clones share the connection and channel, so several relays in one process can publish
/// through one publisher.
#[derive(Debug, Clone)]
pub struct RabbitMqPublisher {
    channel: Channel,
    connection: std::sync::Arc<Connection>,
    address: String,
}

impl RabbitMqPublisher {
    /// Connects to `address` (e.g. `amqp://guest:guest@127.0.0.1:5672/%2f`) and turns on publisher
    /// confirms.
    pub async fn connect(address: &str) -> Result<RabbitMqPublisher, Error> {
        let fail = |what: &str, e: lapin::Error| Error::broker("RabbitMQ", address, what, e);
        let connection = Connection::connect(address, ConnectionProperties::default())
            .await
            .map_err(|e| fail("cannot connect", e))?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| fail("cannot open a channel", e))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| fail("cannot turn on publisher confirms", e))?;
        Ok(RabbitMqPublisher {
            channel,
            connection: std::sync::Arc::new(connection),
            address: address.to_owned(),
        })
    }

    /// The channel, to declare queues and bindings.
    pub fn channel(&self) -> &Channel {
        &self.channel
    }

    /// Declares a durable topic exchange `name` unless it exists.
    pub async fn declare_exchange(&self, name: &str) -> Result<(), Error> {
        self.channel
            .exchange_declare(
                ShortString::from(name),
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| {
                Error::broker(
                    "RabbitMQ",
                    &self.address,
                    format!("cannot declare exchange {name}"),
                    e,
                )
            })
    }
}

impl Publisher for RabbitMqPublisher {
    async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        let mut pending = Vec::with_capacity(messages.len());
        for message in messages {
            let mut headers = FieldTable::default();
            for (name, value) in event_headers(message) {
                headers.insert(
                    ShortString::from(name),
                    AMQPValue::LongString(LongString::from(value)),
                );
            }
            let properties = BasicProperties::default()
                .with_message_id(ShortString::from(message.message_id.as_str()))
                .with_content_type(ShortString::from("application/json"))
                .with_delivery_mode(2)
                .with_headers(headers);
            let sent = match serde_json::to_vec(&message.envelope) {
                Ok(payload) => self
                    .channel
                    .basic_publish(
                        ShortString::from(message.topic.as_deref().unwrap_or("")),
                        ShortString::from(message.routing_key.as_deref().unwrap_or("")),
                        BasicPublishOptions {
                            mandatory: true,
                            ..BasicPublishOptions::default()
                        },
                        &payload,
                        properties,
                    )
                    .await
                    .map_err(|e| PublishError::with_source("RabbitMQ publish failed", e)),
                Err(e) => Err(PublishError::with_source(
                    "cannot serialize the envelope",
                    e,
                )),
            };
            pending.push((message, sent));
        }
        let mut results = Vec::with_capacity(messages.len());
        for (message, sent) in pending {
            results.push(match sent {
                Ok(confirm) => match confirm.await {
                    Ok(Confirmation::Ack(None)) => Ok(()),
                    Ok(Confirmation::Ack(Some(_)) | Confirmation::Nack(Some(_))) => Err(PublishError::new(format!(
                        "RabbitMQ returned the message: no queue is bound to exchange `{}` for routing key `{}`",
                        message.topic.as_deref().unwrap_or(""),
                        message.routing_key.as_deref().unwrap_or("")
                    ))),
                    Ok(Confirmation::Nack(None)) => Err(PublishError::new("RabbitMQ refused the message (nack)")),
                    Ok(Confirmation::NotRequested) => Err(PublishError::new("publisher confirms are off on this channel")),
                    Err(e) => Err(PublishError::with_source("RabbitMQ did not confirm the publish", e)),
                },
                Err(e) => Err(e),
            });
        }
        results
    }
}

/// A durable RabbitMQ queue feeding a [`Consumer`](crate::Consumer), with manual acks: each
/// message is acknowledged only after it was processed (applied and committed, a duplicate,
/// ignored, or quarantined). A message whose processing stopped the consumer is requeued.
///
/// The subscription starts consuming at its first drain and keeps consuming until it is
/// dropped, so no delivery waits between two drains.
#[derive(Debug)]
pub struct RabbitMqSubscription {
    channel: Channel,
    queue: String,
    batch: usize,
    deliveries: tokio::sync::Mutex<Option<lapin::Consumer>>,
}

impl RabbitMqSubscription {
    /// Declares the durable queue `queue`, binds it to `exchange` with `binding_key` (e.g.
    /// `order.*`), and takes up to 100 unacknowledged messages at a time.
    pub async fn bind(
        publisher: &RabbitMqPublisher,
        exchange: &str,
        queue: &str,
        binding_key: &str,
    ) -> Result<RabbitMqSubscription, Error> {
        use lapin::options::{BasicQosOptions, QueueBindOptions, QueueDeclareOptions};
        let fail = |what: &str, e: lapin::Error| {
            Error::broker("RabbitMQ", &publisher.address, format!("{what} {queue}"), e)
        };
        let channel = publisher
            .connection
            .create_channel()
            .await
            .map_err(|e| fail("cannot open a channel for", e))?;
        channel
            .queue_declare(
                ShortString::from(queue),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| fail("cannot declare", e))?;
        channel
            .queue_bind(
                ShortString::from(queue),
                ShortString::from(exchange),
                ShortString::from(binding_key),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| fail("cannot bind", e))?;
        channel
            .basic_qos(PREFETCH, BasicQosOptions::default())
            .await
            .map_err(|e| fail("cannot set the prefetch of", e))?;
        Ok(RabbitMqSubscription {
            channel,
            queue: queue.to_owned(),
            batch: 1,
            deliveries: tokio::sync::Mutex::new(None),
        })
    }

    /// Applies up to `size` messages in one database transaction (see
    /// [`Consumer::receive_batch`](crate::Consumer::receive_batch)) and acknowledges them with
    /// one multiple ack: the deliveries already prefetched are taken at once, up to `size`,
    /// without waiting for a batch to fill. 1, the default, is one transaction per message.
    /// At most the prefetch (1000) is used.
    pub fn batch(mut self, size: usize) -> RabbitMqSubscription {
        self.batch = size.clamp(1, PREFETCH as usize);
        self
    }

    /// Processes messages until `shutdown` completes (the message in hand is finished first),
    /// and reports what it did. A consumer that must stop (a bug) returns the error.
    pub async fn run<DB: Backend, R: Routes<DB>>(
        &self,
        consumer: &Consumer<DB, R>,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<super::ConsumeReport, Error> {
        super::run_until(self, consumer, shutdown).await
    }

    /// Processes messages until none arrives for `idle`, and reports what it did.
    pub async fn drain<DB: Backend, R: Routes<DB>>(
        &self,
        consumer: &Consumer<DB, R>,
        idle: std::time::Duration,
    ) -> Result<super::ConsumeReport, Error> {
        use futures_util::{FutureExt, StreamExt};
        use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions};
        let stopped = |e: lapin::Error| Error::stopped(consumer.name(), "RabbitMQ failed", e);
        let mut guard = self.deliveries.lock().await;
        if guard.is_none() {
            let tag = format!("{}-{}", consumer.name(), std::process::id());
            *guard = Some(
                self.channel
                    .basic_consume(
                        ShortString::from(self.queue.as_str()),
                        ShortString::from(tag.as_str()),
                        BasicConsumeOptions::default(),
                        FieldTable::default(),
                    )
                    .await
                    .map_err(&stopped)?,
            );
        }
        let Some(deliveries) = guard.as_mut() else {
            unreachable!("the consumer was just started")
        };
        let mut report = super::ConsumeReport::default();
        loop {
            let mut batch = match tokio::time::timeout(idle, deliveries.next()).await {
                Err(_) => return Ok(report),
                Ok(None) => {
                    *guard = None;
                    return Err(Error::stopped(
                        consumer.name(),
                        "RabbitMQ failed",
                        format!("the broker cancelled the consumer of queue {}", self.queue),
                    ));
                }
                Ok(Some(delivery)) => vec![delivery.map_err(&stopped)?],
            };
            while batch.len() < self.batch {
                match deliveries.next().now_or_never() {
                    Some(Some(delivery)) => batch.push(delivery.map_err(&stopped)?),
                    _ => break,
                }
            }
            let Some(last) = batch.last() else {
                continue;
            };
            let processed = super::receive_batch(
                consumer,
                &batch,
                |d| &d.data,
                |d| d.properties.message_id().as_ref().map(|m| m.to_string()),
                &mut report,
            )
            .await;
            match processed {
                Ok(()) => {
                    // One ack for the batch: every earlier delivery of this channel is acked.
                    last.ack(BasicAckOptions { multiple: true })
                        .await
                        .map_err(&stopped)?;
                }
                Err(stop) => {
                    let _ = last
                        .nack(BasicNackOptions {
                            multiple: true,
                            requeue: true,
                        })
                        .await;
                    return Err(stop);
                }
            }
        }
    }
}

impl super::Drain for RabbitMqSubscription {
    async fn drain_once<DB: Backend, R: Routes<DB>>(
        &self,
        consumer: &Consumer<DB, R>,
        idle: std::time::Duration,
    ) -> Result<super::ConsumeReport, Error> {
        self.drain(consumer, idle).await
    }
}

impl Drop for RabbitMqSubscription {
    /// Closes the subscription's channel, so that the deliveries it holds unacknowledged go back
    /// to the queue for another consumer at once.
    fn drop(&mut self) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let channel = self.channel.clone();
            runtime.spawn(async move {
                let _ = channel
                    .close(200, ShortString::from("subscription dropped"))
                    .await;
            });
        }
    }
}
