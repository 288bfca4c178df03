//! One type for the publishers, and one for the subscriptions, of the three brokers, so that a
//! test or a benchmark runs the same scenario on each.

use event_sqlx::{
    Backend, ConsumeReport, Consumer, Error, JetStreamSubscription, KafkaPublisher,
    KafkaSubscription, NatsPublisher, OutboxMessage, PublishError, Publisher, RabbitMqPublisher,
    RabbitMqSubscription, Routes, WireFormat,
};

/// One of the three brokers' publishers.
#[derive(Debug, Clone)]
pub enum AnyPublisher {
    /// NATS JetStream.
    Nats(NatsPublisher),
    /// RabbitMQ.
    Rabbit(RabbitMqPublisher),
    /// Kafka.
    Kafka(KafkaPublisher),
}

impl Publisher for AnyPublisher {
    async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        match self {
            AnyPublisher::Nats(p) => p.publish(messages).await,
            AnyPublisher::Rabbit(p) => p.publish(messages).await,
            AnyPublisher::Kafka(p) => p.publish(messages).await,
        }
    }
}

impl AnyPublisher {
    /// The same publisher, publishing in `format`.
    pub fn wire_format(self, format: WireFormat) -> AnyPublisher {
        match self {
            AnyPublisher::Nats(p) => AnyPublisher::Nats(p.wire_format(format)),
            AnyPublisher::Rabbit(p) => AnyPublisher::Rabbit(p.wire_format(format)),
            AnyPublisher::Kafka(p) => AnyPublisher::Kafka(p.wire_format(format)),
        }
    }
}

/// One of the three brokers' subscriptions.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // one or two per test
pub enum AnySubscription {
    /// NATS JetStream.
    Nats(JetStreamSubscription),
    /// RabbitMQ.
    Rabbit(RabbitMqSubscription),
    /// Kafka.
    Kafka(KafkaSubscription),
}

impl AnySubscription {
    /// The subscription's `run`: processes messages until `shutdown` completes.
    pub async fn run<DB: Backend, R: Routes<DB>>(
        &self,
        consumer: &Consumer<DB, R>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<ConsumeReport, Error> {
        match self {
            AnySubscription::Nats(s) => s.run(consumer, shutdown).await,
            AnySubscription::Rabbit(s) => s.run(consumer, shutdown).await,
            AnySubscription::Kafka(s) => s.run(consumer, shutdown).await,
        }
    }

    /// The subscription's `drain`: processes messages until none arrives for `idle`.
    pub async fn drain<DB: Backend, R: Routes<DB>>(
        &self,
        consumer: &Consumer<DB, R>,
        idle: std::time::Duration,
    ) -> Result<ConsumeReport, Error> {
        match self {
            AnySubscription::Nats(s) => s.drain(consumer, idle).await,
            AnySubscription::Rabbit(s) => s.drain(consumer, idle).await,
            AnySubscription::Kafka(s) => s.drain(consumer, idle).await,
        }
    }
}

/// The durable JetStream consumer `durable` on `stream` for `filter_subject`, on `publisher`'s
/// connection, with an ack wait (30 s) longer than any test.
pub async fn durable(
    publisher: &NatsPublisher,
    stream: &str,
    durable: &str,
    filter_subject: &str,
) -> JetStreamSubscription {
    JetStreamSubscription::durable(
        publisher,
        stream,
        durable,
        filter_subject,
        std::time::Duration::from_secs(30),
    )
    .await
    .unwrap()
}

/// Creates (unless it exists) the JetStream stream for `topic`: named after it (upper case, `_`
/// for `-`) and capturing `<topic>.>`. Returns its name.
pub async fn stream_for(publisher: &NatsPublisher, topic: &str) -> Result<String, Error> {
    let stream = topic.replace('-', "_").to_uppercase();
    publisher
        .ensure_stream(&stream, vec![format!("{topic}.>")])
        .await?;
    Ok(stream)
}

/// A publisher on the NATS server of `EVENT_TEST_NATS_URL`; `None` (the test skips) when it is
/// unreachable, unless services are required.
pub async fn nats() -> Option<NatsPublisher> {
    let url = crate::db::nats_url();
    crate::db::reachable("NATS", &url, NatsPublisher::connect(&url).await)
}

/// A publisher on the RabbitMQ server of `EVENT_TEST_AMQP_URL`; `None` (the test skips) when it
/// is unreachable, unless services are required.
pub async fn rabbitmq() -> Option<RabbitMqPublisher> {
    let url = crate::db::amqp_url();
    crate::db::reachable("RabbitMQ", &url, RabbitMqPublisher::connect(&url).await)
}

/// A publisher on the Kafka-protocol broker of `EVENT_TEST_KAFKA_URL`; `None` (the test skips)
/// when it is unreachable, unless services are required.
pub async fn kafka() -> Option<KafkaPublisher> {
    let url = crate::db::kafka_url();
    crate::db::reachable("Kafka", &url, KafkaPublisher::connect(&url).await)
}

/// Deletes the RabbitMQ queue `queue`.
pub async fn delete_queue(publisher: &RabbitMqPublisher, queue: &str) {
    publisher
        .channel()
        .queue_delete(
            lapin::types::ShortString::from(queue),
            lapin::options::QueueDeleteOptions::default(),
        )
        .await
        .unwrap();
}

/// Takes one message off the RabbitMQ queue `queue` (acknowledged), if there is one.
pub async fn get_one(
    publisher: &RabbitMqPublisher,
    queue: &str,
) -> Option<lapin::message::Delivery> {
    let options = lapin::options::BasicGetOptions { no_ack: true };
    let queue = lapin::types::ShortString::from(queue);
    let got = publisher.channel().basic_get(queue, options).await.unwrap();
    got.map(|m| m.delivery)
}

/// The first message of the JetStream stream `stream`.
pub async fn first_message(
    js: &async_nats::jetstream::Context,
    stream: &str,
) -> async_nats::jetstream::message::StreamMessage {
    js.get_stream(stream)
        .await
        .unwrap()
        .get_raw_message(1)
        .await
        .unwrap()
}

/// How many messages the JetStream stream `stream` holds.
pub async fn stream_messages(publisher: &NatsPublisher, stream: &str) -> u64 {
    let stream = publisher.jetstream().get_stream(stream).await.unwrap();
    stream.get_info().await.unwrap().state.messages
}
