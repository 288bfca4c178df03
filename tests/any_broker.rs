//! One type for the publishers, and one for the subscriptions, of the three brokers, so that a
//! test or a benchmark runs the same scenario on each.

use event_sqlx::{
    Backend, ConsumeReport, Consumer, Error, JetStreamSubscription, KafkaPublisher,
    KafkaSubscription, NatsPublisher, OutboxMessage, PublishError, Publisher, RabbitMqPublisher,
    RabbitMqSubscription, Routes,
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

/// How many messages the JetStream stream `stream` holds.
pub async fn stream_messages(publisher: &NatsPublisher, stream: &str) -> u64 {
    let stream = publisher.jetstream().get_stream(stream).await.unwrap();
    stream.get_info().await.unwrap().state.messages
}
