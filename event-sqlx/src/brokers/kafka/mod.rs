//! Kafka, through rdkafka (librdkafka).

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};
use rdkafka::types::RDKafkaErrorCode;

use super::Binding;
use crate::error::Error;
use crate::publisher::{OutboxMessage, PublishError, Publisher};
use crate::wire::WireFormat;

mod subscription;

pub use subscription::KafkaSubscription;

/// How long connecting waits for the cluster's metadata before calling the broker unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Publishes to Kafka with the idempotent producer (`enable.idempotence=true`, `acks=all`), so
/// that librdkafka's own retries never write a message twice or out of order:
///
/// - topic = the row's topic (the event type in lowercase when it has none);
/// - key = the aggregate id, the seed's partition key: every event of one aggregate goes to one
///   partition, where Kafka keeps their order;
/// - value = the envelope's JSON; headers = `messageId` (the event number, the consumer's
///   deduplication id) and the event's metadata (`eventId`, `eventType`, `aggregateId`, ...).
///
/// A publish counts as done when its delivery report says the record is written. A record the
/// cluster refuses (an unknown topic, too large) is a failed publish of that event, retried by
/// the relay with backoff; a cluster that stays unreachable or leaderless for
/// `delivery.timeout.ms` (30 s by default) is an outage ([`PublishError::unavailable`]), which
/// does not count against the events. librdkafka reconnects by itself; a producer that had a
/// fatal error (fenced, out of sequence after a lost connection) is replaced by a new one at the
/// next publish, and its records count as an outage too.
#[derive(Clone)]
pub struct KafkaPublisher {
    /// Replaced by a new producer after a fatal error (an idempotent producer fenced or out of
    /// sequence), which librdkafka does not recover from by itself.
    producer: std::sync::Arc<std::sync::RwLock<FutureProducer>>,
    /// Set when a delivery report blamed the producer itself (fenced, out of sequence).
    broken: std::sync::Arc<std::sync::atomic::AtomicBool>,
    config: ClientConfig,
    address: String,
    delivery_timeout: Duration,
    format: WireFormat,
}

impl std::fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaPublisher")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

/// The client settings both sides share.
fn client_config(bootstrap: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        // Reconnect within a second of the broker coming back, not librdkafka's 10 s backoff.
        .set("reconnect.backoff.max.ms", "1000")
        .set("socket.timeout.ms", "10000")
        .set("log_level", "3");
    config
}

/// Reads the cluster's metadata, so that an unreachable address fails here, clearly, within
/// [`CONNECT_TIMEOUT`].
async fn check_reachable(bootstrap: &str) -> Result<(), KafkaError> {
    let config = client_config(bootstrap);
    // librdkafka's metadata call blocks its thread: on a blocking thread, once.
    tokio::task::spawn_blocking(move || {
        let probe: rdkafka::producer::BaseProducer = config.create()?;
        probe
            .client()
            .fetch_metadata(None, CONNECT_TIMEOUT)
            .map(|_| ())
    })
    .await
    .unwrap_or(Err(KafkaError::Canceled))
}

impl KafkaPublisher {
    /// A publisher to the cluster at `bootstrap` (`host:port[,host:port...]`), checked by
    /// reading the cluster's metadata (at most 10 s).
    pub async fn connect(bootstrap: &str) -> Result<KafkaPublisher, Error> {
        Self::with_config(bootstrap, &[]).await
    }

    /// [`KafkaPublisher::connect`] with more librdkafka settings (`("compression.type",
    /// "lz4")`, security settings, `("delivery.timeout.ms", "30000")`). The idempotence settings
    /// cannot be turned off.
    pub async fn with_config(
        bootstrap: &str,
        settings: &[(&str, &str)],
    ) -> Result<KafkaPublisher, Error> {
        let fail = |what: &str, e: KafkaError| Error::broker("Kafka", bootstrap, what, e);
        let mut config = client_config(bootstrap);
        config
            .set("linger.ms", "1")
            .set("delivery.timeout.ms", "30000");
        for (key, value) in settings {
            config.set(*key, *value);
        }
        config.set("enable.idempotence", "true").set("acks", "all");
        let delivery_timeout = config
            .get("delivery.timeout.ms")
            .and_then(|ms| ms.parse::<u64>().ok())
            .map_or(Duration::from_secs(30), Duration::from_millis);
        let producer: FutureProducer = config
            .create()
            .map_err(|e| fail("cannot create the producer", e))?;
        check_reachable(bootstrap)
            .await
            .map_err(|e| fail("cannot reach the cluster", e))?;
        Ok(KafkaPublisher {
            producer: std::sync::Arc::new(std::sync::RwLock::new(producer)),
            broken: std::sync::Arc::default(),
            config,
            address: bootstrap.to_owned(),
            delivery_timeout,
            format: WireFormat::Envelope,
        })
    }

    /// Publishes in `format`: this toolkit's envelope (the default) or a CloudEvent in binary
    /// mode (`ce_` headers and `content-type`, as the CloudEvents Kafka binding says) or
    /// structured mode (see [`WireFormat`]). The key stays the aggregate id, the CloudEvents
    /// `partitionkey`. Subscriptions read every format.
    pub fn wire_format(mut self, format: WireFormat) -> KafkaPublisher {
        self.format = format;
        self
    }

    /// Creates the topic `name` with `partitions` partitions (replication factor 1 on a
    /// one-broker cluster, the cluster's default otherwise) unless it exists.
    pub async fn ensure_topic(&self, name: &str, partitions: i32) -> Result<(), Error> {
        let fail = |e: String| {
            Error::broker(
                "Kafka",
                &self.address,
                format!("cannot create topic {name}"),
                e,
            )
        };
        let admin: AdminClient<DefaultClientContext> = client_config(&self.address)
            .create()
            .map_err(|e| fail(e.to_string()))?;
        let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(-1));
        let results = admin
            .create_topics(
                [&topic],
                &AdminOptions::new().operation_timeout(Some(CONNECT_TIMEOUT)),
            )
            .await
            .map_err(|e| fail(e.to_string()))?;
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((topic, code)) => return Err(fail(format!("{topic}: {code}"))),
            }
        }
        Ok(())
    }

    /// The topic a message is published to.
    pub fn topic(message: &OutboxMessage) -> String {
        match &message.topic {
            Some(topic) => topic.clone(),
            None => message.envelope.event_type.to_ascii_lowercase(),
        }
    }
}

impl KafkaPublisher {
    /// The producer to publish with: a new one when the current one had a fatal error, or
    /// the broker refused it (fenced, out of sequence) in the last batch.
    fn producer(&self) -> FutureProducer {
        use std::sync::atomic::Ordering;
        let current = self
            .producer
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let (code, reason) = match current.client().fatal_error() {
            Some((code, reason)) => (code, reason),
            None if self.broken.swap(false, Ordering::SeqCst) => (
                RDKafkaErrorCode::ProducerFenced,
                "refused by the broker".to_owned(),
            ),
            None => return current,
        };
        match self.config.create::<FutureProducer>() {
            Ok(fresh) => {
                tracing::warn!(broker = %self.address, ?code, %reason, "the Kafka producer failed for good (a fatal error, or fenced by the broker); publishing with a new one");
                *self
                    .producer
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = fresh.clone();
                fresh
            }
            Err(e) => {
                tracing::warn!(broker = %self.address, error = %e, "cannot create a new Kafka producer");
                current
            }
        }
    }
}

impl Publisher for KafkaPublisher {
    fn messaging_system(&self) -> &'static str {
        "kafka"
    }

    fn destination(&self, message: &OutboxMessage) -> String {
        Self::topic(message)
    }

    async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        // Enqueue every record, then wait for the delivery reports: librdkafka batches them.
        let producer = self.producer();
        let mut pending = Vec::with_capacity(messages.len());
        for message in messages {
            let topic = Self::topic(message);
            let outbound = match super::outbound(message, self.format, Binding::Kafka) {
                Ok(outbound) => outbound,
                Err(e) => {
                    pending.push(Err(e));
                    continue;
                }
            };
            let mut headers = OwnedHeaders::new().insert(Header {
                key: "messageId",
                value: Some(message.message_id.as_str()),
            });
            for (name, value) in &outbound.headers {
                headers = headers.insert(Header {
                    key: name.as_ref(),
                    value: Some(value.as_str()),
                });
            }
            let record = FutureRecord::to(&topic)
                .key(message.envelope.aggregate_id.as_str())
                .payload(&outbound.body)
                .headers(headers);
            pending.push(match producer.send_result(record) {
                Ok(delivery) => Ok(delivery),
                Err((e, _)) => Err(publish_failure("Kafka refused the record", e)),
            });
        }
        // Every delivery report is awaited at once, under one deadline: librdkafka gives up on
        // a record after `delivery.timeout.ms`, and the deadline only guards against a report
        // that never comes.
        use futures_util::StreamExt;
        use futures_util::stream::FuturesUnordered;
        let mut results: Vec<Option<Result<(), PublishError>>> = Vec::with_capacity(pending.len());
        let mut reports = FuturesUnordered::new();
        for (at, sent) in pending.into_iter().enumerate() {
            match sent {
                Ok(delivery) => {
                    results.push(None);
                    reports.push(async move { (at, delivery.await) });
                }
                Err(e) => results.push(Some(Err(e))),
            }
        }
        let settle = async {
            while let Some((at, report)) = reports.next().await {
                results[at] = Some(match report {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err((e, _))) => {
                        if producer_refused(&e) {
                            self.broken.store(true, std::sync::atomic::Ordering::SeqCst);
                        }
                        Err(publish_failure("Kafka did not write the record", e))
                    }
                    Err(_) => Err(PublishError::unavailable(
                        "Kafka did not write the record",
                        "the producer stopped before reporting the delivery",
                    )),
                });
            }
        };
        let _ = tokio::time::timeout(self.delivery_timeout + REPORT_GRACE, settle).await;
        super::settle(results, || {
            PublishError::unavailable(
                "Kafka did not report the delivery",
                format!(
                    "no report within {} s (delivery.timeout.ms)",
                    self.delivery_timeout.as_secs_f64()
                ),
            )
        })
    }
}

/// Whether the broker refused the producer rather than the record: an idempotent producer
/// fenced or out of sequence (after a lost connection, say), which must be replaced.
fn producer_refused(e: &KafkaError) -> bool {
    use RDKafkaErrorCode as Code;
    let code = match e {
        KafkaError::MessageProduction(code) => Some(*code),
        _ => e.rdkafka_error_code(),
    };
    matches!(
        code,
        Some(
            Code::Fatal
                | Code::ProducerFenced
                | Code::InvalidProducerEpoch
                | Code::OutOfOrderSequenceNumber
                | Code::UnknownProducerId
        )
    )
}

/// How long past `delivery.timeout.ms` a delivery report is waited for.
const REPORT_GRACE: Duration = Duration::from_secs(2);

/// A failed produce: an outage when the cluster is unreachable, has no leader or did not answer
/// in time (librdkafka already retried), a rejection of the record otherwise (too large, an
/// unknown topic, not authorized, invalid).
fn publish_failure(context: &str, e: KafkaError) -> PublishError {
    use RDKafkaErrorCode as Code;
    let code = match &e {
        KafkaError::MessageProduction(code) => Some(*code),
        _ => e.rdkafka_error_code(),
    };
    match code {
        Some(
            Code::MessageTimedOut
            | Code::QueueFull
            | Code::AllBrokersDown
            | Code::BrokerTransportFailure
            | Code::RequestTimedOut
            | Code::NetworkException
            | Code::LeaderNotAvailable
            | Code::NotLeaderForPartition
            | Code::NotEnoughReplicas
            | Code::NotEnoughReplicasAfterAppend
            | Code::BrokerNotAvailable
            | Code::NotCoordinator
            | Code::OperationTimedOut
            // The producer, not the record: the next publish uses a new producer.
            | Code::Fatal
            | Code::ProducerFenced
            | Code::InvalidProducerEpoch
            | Code::OutOfOrderSequenceNumber
            | Code::UnknownProducerId,
        ) => PublishError::unavailable(context, e),
        _ => PublishError::with_source(context, e),
    }
}
