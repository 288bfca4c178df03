//! RabbitMQ.

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind,
};

use std::time::Duration;

use super::Binding;
use crate::error::BoxError;
use crate::wire::WireFormat;

use crate::error::Error;
use crate::publisher::{OutboxMessage, PublishError, Publisher};

mod subscription;

pub use subscription::RabbitMqSubscription;

/// Publishes to RabbitMQ with publisher confirms: exchange = the row's topic, routing key = its
/// routing key, persistent messages, `message_id` = event number, `application/json`.
///
/// Messages are published `mandatory`: one that no queue receives comes back, and counts as a
/// failed publish of that event (retried with backoff), never as delivered.
///
/// The partition key is the aggregate id, the seed's ordering scope, in the `aggregateId`
/// header: bind queues through a consistent-hash exchange with `hash-header = aggregateId` to
/// spread aggregates over queues while each aggregate keeps to one queue, and so its order.
///
/// A lost connection or channel is opened again by the next publish (the relay pauses between
/// tries while the broker is unreachable); a batch not confirmed within the confirm timeout,
/// like a lost connection, is an outage ([`PublishError::unavailable`]) that does not count
/// against the events.
///
/// Clones share the connection and channel, so several relays in one process can publish
/// through one publisher.
#[derive(Debug, Clone)]
pub struct RabbitMqPublisher {
    link: std::sync::Arc<std::sync::Mutex<Link>>,
    /// Held while a new connection or channel is opened, so that one publish opens it.
    reopening: std::sync::Arc<tokio::sync::Mutex<()>>,
    /// Set when a batch's confirms did not come in time although the connection looked open:
    /// the next publish opens a new connection rather than trust this one.
    suspect: std::sync::Arc<std::sync::atomic::AtomicBool>,
    address: crate::brokers::Address,
    confirm_timeout: Duration,
    format: WireFormat,
}

/// The connection and the confirming channel publishes go through.
#[derive(Debug, Clone)]
struct Link {
    connection: std::sync::Arc<Connection>,
    channel: Channel,
}

/// The confirm timeout unless [`RabbitMqPublisher::confirm_timeout`] sets another.
const DEFAULT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);

/// How long opening a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl RabbitMqPublisher {
    /// Connects to `address` (e.g. `amqp://guest:guest@127.0.0.1:5672/%2f`) and turns on publisher
    /// confirms.
    pub async fn connect(address: &str) -> Result<RabbitMqPublisher, Error> {
        let connection = open_connection(address)
            .await
            .map_err(|(what, e)| Error::broker("RabbitMQ", address, what, e))?;
        let channel = confirming_channel(&connection)
            .await
            .map_err(|(what, e)| Error::broker("RabbitMQ", address, what, e))?;
        Ok(RabbitMqPublisher {
            link: std::sync::Arc::new(std::sync::Mutex::new(Link {
                connection: std::sync::Arc::new(connection),
                channel,
            })),
            reopening: std::sync::Arc::new(tokio::sync::Mutex::new(())),
            suspect: std::sync::Arc::default(),
            address: crate::brokers::Address::new(address),
            confirm_timeout: DEFAULT_CONFIRM_TIMEOUT,
            format: WireFormat::Envelope,
        })
    }

    /// How long a batch may take, from the first publish to the last confirm: 10 s by
    /// default. The confirms are awaited together, so a batch whose confirms are lost fails
    /// after this long, not this long per message; what is not confirmed by then is an outage
    /// ([`PublishError::unavailable`]).
    pub fn confirm_timeout(mut self, timeout: Duration) -> RabbitMqPublisher {
        self.confirm_timeout = timeout;
        self
    }

    /// Publishes in `format`: this toolkit's envelope (the default) or a CloudEvent in binary
    /// mode (`ce-` headers and the `content_type` property, as the CloudEvents SDKs' RabbitMQ
    /// binding) or structured mode (see [`WireFormat`]). Subscriptions read every format.
    pub fn wire_format(mut self, format: WireFormat) -> RabbitMqPublisher {
        self.format = format;
        self
    }

    /// The publishing channel, to declare queues and bindings.
    pub fn channel(&self) -> Channel {
        self.current().channel
    }

    /// The connection and channel now in use.
    fn current(&self) -> Link {
        self.link
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The connection, opened again if it was lost.
    pub(crate) async fn connection(&self) -> Result<std::sync::Arc<Connection>, PublishError> {
        Ok(self.open_link().await?.connection)
    }

    /// A link whose channel is open: the current one, or, when its channel or connection was
    /// lost, a new channel on the connection or a new connection, opened once for all the
    /// publishes that found it lost.
    async fn open_link(&self) -> Result<Link, PublishError> {
        use std::sync::atomic::Ordering::SeqCst;
        let usable = |link: &Link| !self.suspect.load(SeqCst) && link.channel.status().connected();
        let link = self.current();
        if usable(&link) {
            return Ok(link);
        }
        let _reopening = self.reopening.lock().await;
        let link = self.current();
        if usable(&link) {
            return Ok(link);
        }
        let unavailable = |(what, e): (&str, lapin::Error)| {
            PublishError::unavailable(format!("RabbitMQ at {}: {what}", self.address), e)
        };
        let connection = if !self.suspect.load(SeqCst) && link.connection.status().connected() {
            link.connection
        } else {
            tracing::info!(address = %self.address, "RabbitMQ connection lost; connecting again");
            close_in_background(link.connection);
            let connection = open_connection(self.address.url())
                .await
                .map_err(unavailable)?;
            self.suspect.store(false, SeqCst);
            std::sync::Arc::new(connection)
        };
        let channel = confirming_channel(&connection).await.map_err(unavailable)?;
        let link = Link {
            connection,
            channel,
        };
        *self
            .link
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = link.clone();
        Ok(link)
    }

    /// Declares a durable topic exchange `name` unless it exists.
    pub async fn declare_exchange(&self, name: &str) -> Result<(), Error> {
        let fail = |e: BoxError| {
            Error::broker(
                "RabbitMQ",
                self.address.url(),
                format!("cannot declare exchange {name}"),
                e,
            )
        };
        let link = self.open_link().await.map_err(|e| fail(e.into()))?;
        link.channel
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
            .map_err(|e| fail(e.into()))
    }
}

/// Closes a connection given up on, without waiting for a broker that may not answer.
fn close_in_background(connection: std::sync::Arc<Connection>) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            let closing = connection.close(200, ShortString::from("reconnecting"));
            let _ = tokio::time::timeout(CONNECT_TIMEOUT, closing).await;
        });
    }
}

/// Opens a connection within [`CONNECT_TIMEOUT`].
async fn open_connection(address: &str) -> Result<Connection, (&'static str, lapin::Error)> {
    match tokio::time::timeout(
        CONNECT_TIMEOUT,
        Connection::connect(address, ConnectionProperties::default()),
    )
    .await
    {
        Ok(connected) => connected.map_err(|e| ("cannot connect", e)),
        Err(_) => Err((
            "cannot connect",
            lapin::Error::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {} s", CONNECT_TIMEOUT.as_secs()),
            )),
        )),
    }
}

/// A channel on `connection` with publisher confirms on.
async fn confirming_channel(
    connection: &Connection,
) -> Result<Channel, (&'static str, lapin::Error)> {
    let opened = async {
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| ("cannot open a channel", e))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| ("cannot turn on publisher confirms", e))?;
        Ok(channel)
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, opened).await {
        Ok(opened) => opened,
        Err(_) => Err((
            "cannot open a channel",
            lapin::Error::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {} s", CONNECT_TIMEOUT.as_secs()),
            )),
        )),
    }
}

/// A failed publish or confirm: a rejection of the message when the broker refused it (a
/// channel-level AMQP error such as a missing exchange), an outage otherwise (the connection or
/// channel is gone, the socket failed, no heartbeat).
fn publish_failure(context: &str, e: lapin::Error) -> PublishError {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp)
            if matches!(amqp.kind(), lapin::protocol::AMQPErrorKind::Soft(_)) =>
        {
            PublishError::with_source(context, e)
        }
        _ => PublishError::unavailable(context, e),
    }
}

impl Publisher for RabbitMqPublisher {
    fn messaging_system(&self) -> &'static str {
        "rabbitmq"
    }

    /// The exchange.
    fn destination(&self, message: &OutboxMessage) -> String {
        message.topic.clone().unwrap_or_default()
    }

    async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        use futures_util::StreamExt;
        use futures_util::stream::FuturesUnordered;
        let link = match tokio::time::timeout(self.confirm_timeout, self.open_link()).await {
            Ok(Ok(link)) => link,
            Ok(Err(e)) => return messages.iter().map(|_| Err(e.clone())).collect(),
            Err(_) => {
                let e = PublishError::unavailable(
                    format!("RabbitMQ at {}", self.address),
                    "cannot open a channel within the confirm timeout",
                );
                return messages.iter().map(|_| Err(e.clone())).collect();
            }
        };
        let mut results: Vec<Option<Result<(), PublishError>>> = vec![None; messages.len()];
        // Publish every message, then wait for all the confirms at once, under one deadline.
        let work = async {
            let mut confirms = FuturesUnordered::new();
            for (at, message) in messages.iter().enumerate() {
                let outbound = match super::outbound(message, self.format, Binding::Amqp) {
                    Ok(outbound) => outbound,
                    Err(e) => {
                        results[at] = Some(Err(e));
                        continue;
                    }
                };
                let mut headers = FieldTable::default();
                for (name, value) in outbound.headers {
                    headers.insert(
                        ShortString::from(name.as_ref()),
                        AMQPValue::LongString(LongString::from(value)),
                    );
                }
                let properties = BasicProperties::default()
                    .with_message_id(ShortString::from(message.message_id.as_str()))
                    .with_content_type(ShortString::from(
                        outbound.content_type.unwrap_or(crate::wire::JSON),
                    ))
                    .with_delivery_mode(2)
                    .with_headers(headers);
                let payload = outbound.body;
                match link
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
                {
                    Ok(confirm) => confirms.push(async move { (at, confirm.await) }),
                    Err(e) => {
                        results[at] = Some(Err(publish_failure("RabbitMQ publish failed", e)))
                    }
                }
            }
            while let Some((at, confirmed)) = confirms.next().await {
                let message = &messages[at];
                results[at] = Some(match confirmed {
                    Ok(Confirmation::Ack(None)) => Ok(()),
                    Ok(Confirmation::Ack(Some(_)) | Confirmation::Nack(Some(_))) => {
                        Err(PublishError::new(format!(
                            "RabbitMQ returned the message: no queue is bound to exchange `{}` for routing key `{}`",
                            message.topic.as_deref().unwrap_or(""),
                            message.routing_key.as_deref().unwrap_or("")
                        )))
                    }
                    Ok(Confirmation::Nack(None)) => {
                        Err(PublishError::new("RabbitMQ refused the message (nack)"))
                    }
                    Ok(Confirmation::NotRequested) => Err(PublishError::new(
                        "publisher confirms are off on this channel",
                    )),
                    Err(e) => Err(publish_failure("RabbitMQ did not confirm the publish", e)),
                });
            }
        };
        if tokio::time::timeout(self.confirm_timeout, work)
            .await
            .is_err()
        {
            // Confirms lost on a connection that looks alive: connect again next time rather
            // than wait on this one again.
            self.suspect
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
        super::settle(results, || {
            PublishError::unavailable(
                format!(
                    "RabbitMQ did not confirm the batch within {} s (confirm timeout)",
                    self.confirm_timeout.as_secs_f64()
                ),
                "no confirm",
            )
        })
    }
}
