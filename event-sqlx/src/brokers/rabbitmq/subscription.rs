//! Consuming from RabbitMQ: a durable queue bound to the exchange, manual acks after the inbox
//! transaction, prefetch, and early messages held back.

use lapin::Channel;
use lapin::types::{FieldTable, ShortString};

use crate::consumer::Consumer;
use crate::error::{BoxError, Error};
use crate::route::Routes;
use crate::sql::dialect::Backend;

use super::RabbitMqPublisher;

/// Unacknowledged deliveries a subscription holds at most.
pub(super) const PREFETCH: u16 = 1000;

/// A durable RabbitMQ queue feeding a [`Consumer`](crate::Consumer), with manual acks: each
/// message is acknowledged only after it was processed (applied and committed, a duplicate,
/// ignored, or quarantined). A message whose processing stopped the consumer is requeued.
///
/// The subscription starts consuming at its first drain and keeps consuming until it is
/// dropped, so no delivery waits between two drains.
///
/// A lost connection or channel (a broker restart, a cut link) does not end the subscription:
/// the drain that meets it returns a transient [`Error::Broker`], and the next drain opens a
/// channel again (and the connection, through the publisher it was bound to) and consumes again.
/// [`RabbitMqSubscription::run`] does so by itself, pausing between tries while the broker is
/// away. What the lost channel held unacknowledged the broker delivers again; an event whose
/// inbox transaction had committed before its ack was lost is then recognised as a duplicate.
#[derive(Debug)]
pub struct RabbitMqSubscription {
    publisher: RabbitMqPublisher,
    exchange: String,
    queue: String,
    binding_key: String,
    batch: usize,
    deliveries: tokio::sync::Mutex<Intake>,
}

/// What a subscription receives from: its channel, the broker's consumer on it once started,
/// and the deliveries held back because they arrived before their aggregate's previous
/// sequence was applied.
#[derive(Debug, Default)]
pub(super) struct Intake {
    channel: Option<Channel>,
    consumer: Option<lapin::Consumer>,
    held: Vec<lapin::message::Delivery>,
}

impl RabbitMqSubscription {
    /// [`RabbitMqSubscription::bind`] on a connection of its own to `url`
    /// (`amqp://user:pass@host:port/vhost`): for a service that only consumes. The exchange
    /// must exist (the relay's side declares it).
    pub async fn connect(
        url: &str,
        exchange: &str,
        queue: &str,
        binding_key: &str,
    ) -> Result<RabbitMqSubscription, Error> {
        let connection = RabbitMqPublisher::connect(url).await?;
        Self::bind(&connection, exchange, queue, binding_key).await
    }

    /// Declares the durable queue `queue`, binds it to `exchange` with `binding_key` (e.g.
    /// `order.*`), and takes up to 1000 unacknowledged messages at a time. It shares the
    /// connection of `publisher`; [`RabbitMqSubscription::connect`] opens one of its own.
    pub async fn bind(
        publisher: &RabbitMqPublisher,
        exchange: &str,
        queue: &str,
        binding_key: &str,
    ) -> Result<RabbitMqSubscription, Error> {
        let subscription = RabbitMqSubscription {
            publisher: publisher.clone(),
            exchange: exchange.to_owned(),
            queue: queue.to_owned(),
            binding_key: binding_key.to_owned(),
            batch: 1,
            deliveries: tokio::sync::Mutex::new(Intake::default()),
        };
        let channel = subscription.open_channel().await?;
        subscription.deliveries.lock().await.channel = Some(channel);
        Ok(subscription)
    }

    /// A new channel on the publisher's connection (opened again if it was lost), with the
    /// queue declared, bound and its prefetch set.
    async fn open_channel(&self) -> Result<Channel, Error> {
        use lapin::options::{BasicQosOptions, QueueBindOptions, QueueDeclareOptions};
        let queue = self.queue.as_str();
        let fail = |what: &str, e: BoxError| {
            Error::broker(
                "RabbitMQ",
                self.publisher.address.url(),
                format!("{what} {queue}"),
                e,
            )
        };
        let connection = self
            .publisher
            .connection()
            .await
            .map_err(|e| fail("cannot open a channel for", e.into()))?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| fail("cannot open a channel for", e.into()))?;
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
            .map_err(|e| fail("cannot declare", e.into()))?;
        channel
            .queue_bind(
                ShortString::from(queue),
                ShortString::from(self.exchange.as_str()),
                ShortString::from(self.binding_key.as_str()),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| fail("cannot bind", e.into()))?;
        channel
            .basic_qos(PREFETCH, BasicQosOptions::default())
            .await
            .map_err(|e| fail("cannot set the prefetch of", e.into()))?;
        Ok(channel)
    }

    /// The error a failed receive or ack on `channel` stops the drain with: the channel lost
    /// (transient: the next drain opens it again), or else the consumer stopped.
    fn failure(&self, consumer: &str, channel: &Channel, e: lapin::Error) -> Error {
        if channel.status().connected() {
            Error::stopped(consumer, "RabbitMQ failed", e)
        } else {
            self.lost(e)
        }
    }

    /// The transient error of a lost channel: the next drain opens it again.
    fn lost(&self, source: impl Into<BoxError>) -> Error {
        Error::broker(
            "RabbitMQ",
            self.publisher.address.url(),
            format!("lost the channel of {}", self.queue),
            source,
        )
    }

    /// Applies up to `size` messages in one database transaction (see
    /// [`Consumer::receive_batch`](crate::Consumer::receive_batch)) and acknowledges them with
    /// one multiple ack: the deliveries already prefetched are taken at once, up to `size`,
    /// without waiting for a batch to fill. 1, the default, is one transaction per message.
    /// At most the prefetch (1000) is used: a size out of range is clamped, with a warning.
    pub fn batch(mut self, size: usize) -> RabbitMqSubscription {
        self.batch = crate::brokers::batch_size("RabbitMQ", size, PREFETCH as usize);
        self
    }

    /// Processes messages until `shutdown` completes (the message in hand is finished first),
    /// and reports what it did. While the database or the broker is unavailable it pauses
    /// (250 ms, doubling up to 5 s) and goes on, opening its channel again once the broker
    /// answers; a consumer that must stop (a bug, a queue the broker cancelled) returns the
    /// error.
    pub async fn run<DB: Backend, R: Routes<DB>>(
        &self,
        consumer: &Consumer<DB, R>,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<crate::brokers::ConsumeReport, Error> {
        crate::brokers::run_until(self, consumer, shutdown).await
    }

    /// Processes messages until none arrives for `idle`, and reports what it did.
    ///
    /// A delivery that arrives before its aggregate's previous sequence was applied
    /// ([`Processed::Early`](crate::Processed::Early)) is held, unacknowledged, and tried again
    /// after the next batch and every quarter second, while the others go on (RabbitMQ has no
    /// delayed requeue). Held deliveries count against the prefetch.
    pub async fn drain<DB: Backend, R: Routes<DB>>(
        &self,
        consumer: &Consumer<DB, R>,
        idle: std::time::Duration,
    ) -> Result<crate::brokers::ConsumeReport, Error> {
        let mut report = crate::brokers::ConsumeReport::default();
        self.drain_into(consumer, idle, &mut report).await?;
        Ok(report)
    }

    /// [`Self::drain`], adding what it did to `report` as it goes, so that a drain that ends in
    /// an error still counts what it applied before.
    async fn drain_into<DB: Backend, R: Routes<DB>>(
        &self,
        consumer: &Consumer<DB, R>,
        idle: std::time::Duration,
        report: &mut crate::brokers::ConsumeReport,
    ) -> Result<(), Error> {
        use futures_util::{FutureExt, StreamExt};
        use lapin::options::{BasicAckOptions, BasicConsumeOptions};
        let mut guard = self.deliveries.lock().await;
        let intake = &mut *guard;
        let channel = match &intake.channel {
            Some(channel) if channel.status().connected() => channel.clone(),
            lost => {
                // What the lost channel held unacknowledged went back to the queue.
                if lost.is_some() {
                    tracing::info!(queue = %self.queue, "RabbitMQ channel lost; opening it again");
                }
                *intake = Intake::default();
                let channel = self.open_channel().await?;
                intake.channel = Some(channel.clone());
                channel
            }
        };
        let failed = |e: lapin::Error| self.failure(consumer.name(), &channel, e);
        if intake.consumer.is_none() {
            let tag = format!("{}-{}", consumer.name(), std::process::id());
            intake.consumer = Some(
                channel
                    .basic_consume(
                        ShortString::from(self.queue.as_str()),
                        ShortString::from(tag.as_str()),
                        BasicConsumeOptions::default(),
                        FieldTable::default(),
                    )
                    .await
                    .map_err(&failed)?,
            );
        }
        let Intake {
            consumer: Some(deliveries),
            held,
            ..
        } = intake
        else {
            unreachable!("the consumer was just started")
        };
        let mut quiet = std::time::Duration::ZERO;
        let mut holding = None;
        loop {
            let wait = if held.is_empty() {
                idle
            } else {
                crate::brokers::EARLY_RETRY.min(idle)
            };
            let next = match deliveries.next().now_or_never() {
                Some(next) => Ok(next),
                None => {
                    // Nothing waiting: the consumer's connection goes back to the pool while
                    // the queue is quiet.
                    holding = None;
                    tokio::time::timeout(wait, deliveries.next()).await
                }
            };
            let mut batch = match next {
                Err(_) => {
                    quiet += wait;
                    if !held.is_empty() {
                        self.retry_held(consumer, held, report, &failed).await?;
                    }
                    if quiet >= idle {
                        return Ok(());
                    }
                    continue;
                }
                Ok(None) if !channel.status().connected() => {
                    return Err(self.lost("the connection closed"));
                }
                Ok(None) => {
                    intake.consumer = None;
                    return Err(Error::stopped(
                        consumer.name(),
                        "RabbitMQ failed",
                        format!("the broker cancelled the consumer of queue {}", self.queue),
                    ));
                }
                Ok(Some(delivery)) => vec![delivery.map_err(&failed)?],
            };
            quiet = std::time::Duration::ZERO;
            while batch.len() < self.batch {
                match deliveries.next().now_or_never() {
                    Some(Some(delivery)) => batch.push(delivery.map_err(&failed)?),
                    _ => break,
                }
            }
            holding.get_or_insert_with(|| consumer.hold_connection());
            let early = self.process(consumer, &batch, held, report).await?;
            if held.is_empty() && !early.iter().any(|e| *e) {
                // One ack for the batch: every earlier delivery of this channel is acked.
                if let Some(last) = batch.last() {
                    last.ack(BasicAckOptions { multiple: true })
                        .await
                        .map_err(&failed)?;
                }
                continue;
            }
            // Some are held: the others are acked one by one.
            let had_held = !held.is_empty();
            hold_or_ack(batch, early, held, &failed).await?;
            if had_held {
                // The batch may have applied what they waited for.
                self.retry_held(consumer, held, report, &failed).await?;
            }
        }
    }

    /// Processes `batch`, and on `Err` gives back every unacknowledged delivery of the
    /// channel up to the batch's last, the held ones included.
    async fn process<DB: Backend, R: Routes<DB>>(
        &self,
        consumer: &Consumer<DB, R>,
        batch: &[lapin::message::Delivery],
        held: &mut Vec<lapin::message::Delivery>,
        report: &mut crate::brokers::ConsumeReport,
    ) -> Result<Vec<bool>, Error> {
        use lapin::options::BasicNackOptions;
        let processed = crate::brokers::receive_batch(
            consumer,
            batch,
            crate::brokers::Source {
                system: "rabbitmq",
                inbound: &inbound,
                id: &|d: &lapin::message::Delivery| {
                    d.properties.message_id().as_ref().map(|m| m.to_string())
                },
                destination: &|d: &lapin::message::Delivery| d.exchange.to_string(),
            },
            report,
        )
        .await;
        if processed.is_err() {
            let last = batch
                .iter()
                .chain(held.iter())
                .max_by_key(|d| d.delivery_tag);
            if let Some(last) = last {
                let _ = last
                    .nack(BasicNackOptions {
                        multiple: true,
                        requeue: true,
                    })
                    .await;
            }
            held.clear();
        }
        processed
    }

    /// Tries the held deliveries again: acks those that went through, keeps those still early.
    async fn retry_held<DB: Backend, R: Routes<DB>>(
        &self,
        consumer: &Consumer<DB, R>,
        held: &mut Vec<lapin::message::Delivery>,
        report: &mut crate::brokers::ConsumeReport,
        failed: &impl Fn(lapin::Error) -> Error,
    ) -> Result<(), Error> {
        let batch = std::mem::take(held);
        let early = self.process(consumer, &batch, held, report).await?;
        hold_or_ack(batch, early, held, failed).await
    }
}

/// Holds the deliveries that came early and acks the others, one by one: a multiple ack would
/// take the held ones with it.
async fn hold_or_ack(
    batch: Vec<lapin::message::Delivery>,
    early: Vec<bool>,
    held: &mut Vec<lapin::message::Delivery>,
    failed: &impl Fn(lapin::Error) -> Error,
) -> Result<(), Error> {
    use lapin::options::BasicAckOptions;
    for (delivery, early) in batch.into_iter().zip(early) {
        if early {
            held.push(delivery);
        } else {
            delivery
                .ack(BasicAckOptions::default())
                .await
                .map_err(failed)?;
        }
    }
    Ok(())
}

impl crate::brokers::Drain for RabbitMqSubscription {
    async fn drain_once<DB: Backend, R: Routes<DB>>(
        &self,
        consumer: &Consumer<DB, R>,
        idle: std::time::Duration,
        report: &mut crate::brokers::ConsumeReport,
    ) -> Result<(), Error> {
        self.drain_into(consumer, idle, report).await
    }
}

impl Drop for RabbitMqSubscription {
    /// Closes the subscription's channel, so that the deliveries it holds unacknowledged go back
    /// to the queue for another consumer at once.
    fn drop(&mut self) {
        let Some(channel) = self.deliveries.get_mut().channel.take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = channel
                    .close(200, ShortString::from("subscription dropped"))
                    .await;
            });
        }
    }
}

/// A header value as text: strings, numbers and booleans as written, a timestamp in RFC 3339;
/// `None` for the other AMQP types.
fn text(value: &lapin::types::AMQPValue) -> Option<String> {
    use lapin::types::AMQPValue;
    Some(match value {
        AMQPValue::LongString(v) => String::from_utf8_lossy(v.as_bytes()).into_owned(),
        AMQPValue::ShortString(v) => v.as_str().to_owned(),
        AMQPValue::Boolean(v) => v.to_string(),
        AMQPValue::ShortShortInt(v) => v.to_string(),
        AMQPValue::ShortShortUInt(v) => v.to_string(),
        AMQPValue::ShortInt(v) => v.to_string(),
        AMQPValue::ShortUInt(v) => v.to_string(),
        AMQPValue::LongInt(v) => v.to_string(),
        AMQPValue::LongUInt(v) => v.to_string(),
        AMQPValue::LongLongInt(v) => v.to_string(),
        AMQPValue::Timestamp(seconds) => {
            chrono::DateTime::from_timestamp(i64::try_from(*seconds).unwrap_or(i64::MAX), 0)?
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        }
        _ => return None,
    })
}

/// What a CloudEvent needs of a delivery: its body, `content_type` and the attributes of its
/// `ce-` headers (or the AMQP binding's `cloudEvents:` and `cloudEvents_`).
fn inbound(delivery: &lapin::message::Delivery) -> crate::wire::Inbound<'_> {
    let headers = delivery.properties.headers().as_ref();
    let attributes = headers
        .map(|table| {
            let values = table
                .inner()
                .iter()
                .map(|(name, value)| (name.as_str(), value));
            crate::brokers::ce_attributes(values, &["ce-", "cloudevents:", "cloudevents_"], text)
        })
        .unwrap_or_default();
    crate::wire::Inbound {
        body: &delivery.data,
        content_type: delivery
            .properties
            .content_type()
            .as_ref()
            .map(|t| t.as_str().to_owned()),
        attributes,
    }
}
