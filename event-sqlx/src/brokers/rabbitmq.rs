//! RabbitMQ.

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind,
};

use super::{BrokerError, event_headers};
use crate::publisher::{OutboxMessage, PublishError, Publisher};

/// Publishes to RabbitMQ with publisher confirms: exchange = the row's topic, routing key = its
/// routing key, persistent messages, `message_id` = event number, `application/json`.
///
/// Messages are published `mandatory`: one that no queue receives comes back, and counts as a
/// failed publish (retried with backoff), never as delivered.
#[derive(Debug)]
pub struct RabbitMqPublisher {
    channel: Channel,
    _connection: Connection,
    address: String,
}

impl RabbitMqPublisher {
    /// Connects to `address` (e.g. `amqp://guest:guest@127.0.0.1:5672/%2f`) and turns on publisher
    /// confirms.
    pub async fn connect(address: &str) -> Result<RabbitMqPublisher, BrokerError> {
        let fail = |what: &str, e: lapin::Error| {
            BrokerError::new("RabbitMQ", address, format!("{what}: {e}"))
        };
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
            _connection: connection,
            address: address.to_owned(),
        })
    }

    /// The channel, to declare queues and bindings.
    pub fn channel(&self) -> &Channel {
        &self.channel
    }

    /// Declares a durable topic exchange `name` unless it exists.
    pub async fn declare_exchange(&self, name: &str) -> Result<(), BrokerError> {
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
                BrokerError::new(
                    "RabbitMQ",
                    &self.address,
                    format!("cannot declare exchange {name}: {e}"),
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
                .with_message_id(ShortString::from(message.envelope.event_id.as_str()))
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
                    .map_err(|e| PublishError::new(format!("RabbitMQ publish failed: {e}"))),
                Err(e) => Err(PublishError::new(e)),
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
                    Err(e) => Err(PublishError::new(format!("RabbitMQ did not confirm the publish: {e}"))),
                },
                Err(e) => Err(e),
            });
        }
        results
    }
}
