//! Kafka, through rdkafka (librdkafka).

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{CommitMode, Consumer as _, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use super::event_headers;
use crate::consumer::Consumer;
use crate::error::Error;
use crate::publisher::{OutboxMessage, PublishError, Publisher};
use crate::route::Routes;
use crate::sql::dialect::Backend;

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
        })
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
    async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        // Enqueue every record, then wait for the delivery reports: librdkafka batches them.
        let producer = self.producer();
        let mut pending = Vec::with_capacity(messages.len());
        for message in messages {
            let topic = Self::topic(message);
            let payload = match super::payload(message) {
                Ok(payload) => payload,
                Err(e) => {
                    pending.push(Err(e));
                    continue;
                }
            };
            let mut headers = OwnedHeaders::new().insert(Header {
                key: "messageId",
                value: Some(message.message_id.as_str()),
            });
            for (name, value) in event_headers(message) {
                headers = headers.insert(Header {
                    key: name,
                    value: Some(value.as_str()),
                });
            }
            let record = FutureRecord::to(&topic)
                .key(message.envelope.aggregate_id.as_str())
                .payload(&payload)
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

/// A Kafka consumer group feeding a [`Consumer`](crate::Consumer): offsets are committed only
/// after the inbox transaction of the messages before them committed (auto-commit is off), so
/// a process that dies redelivers what it had not committed, and the inbox turns each
/// redelivery into a duplicate. Messages of one partition are processed in order.
pub struct KafkaSubscription {
    consumer: StreamConsumer,
    address: String,
    batch: usize,
    held: tokio::sync::Mutex<Held>,
}

/// Messages held back because they arrived before their aggregate's previous sequence was
/// applied, and the next offset processed per partition; the offset committed for a partition
/// stops at its first held message.
#[derive(Debug, Default)]
struct Held {
    messages: Vec<rdkafka::message::OwnedMessage>,
    processed: BTreeMap<(String, i32), i64>,
}

impl Held {
    /// Notes `message` as read: its partition's next offset moves past it. Returns the
    /// partition.
    fn read(&mut self, message: &impl Message) -> (String, i32) {
        let partition = (message.topic().to_owned(), message.partition());
        let next = self.processed.entry(partition.clone()).or_insert(0);
        *next = (*next).max(message.offset() + 1);
        partition
    }

    /// The offsets to commit for `partitions`: the next processed, or the first held.
    fn offsets(&self, partitions: &[(String, i32)]) -> Vec<((String, i32), i64)> {
        partitions
            .iter()
            .filter_map(|partition| {
                let next = *self.processed.get(partition)?;
                let first_held = self
                    .messages
                    .iter()
                    .filter(|m| (m.topic(), m.partition()) == (partition.0.as_str(), partition.1))
                    .map(|m| m.offset())
                    .min();
                Some((
                    partition.clone(),
                    first_held.map_or(next, |held| held.min(next)),
                ))
            })
            .collect()
    }
}

impl std::fmt::Debug for KafkaSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSubscription")
            .field("address", &self.address)
            .field("batch", &self.batch)
            .finish_non_exhaustive()
    }
}

impl KafkaSubscription {
    /// Joins the consumer group `group` on the cluster at `bootstrap` and subscribes to
    /// `topics`; a group with no committed offset starts at the earliest message.
    pub async fn subscribe(
        bootstrap: &str,
        group: &str,
        topics: &[&str],
    ) -> Result<KafkaSubscription, Error> {
        Self::with_config(bootstrap, group, topics, &[]).await
    }

    /// [`KafkaSubscription::subscribe`] with more librdkafka settings
    /// (`("session.timeout.ms", "10000")`, security settings). Auto-commit cannot be turned on.
    pub async fn with_config(
        bootstrap: &str,
        group: &str,
        topics: &[&str],
        settings: &[(&str, &str)],
    ) -> Result<KafkaSubscription, Error> {
        let fail = |what: String, e: KafkaError| Error::broker("Kafka", bootstrap, what, e);
        let mut config = client_config(bootstrap);
        config
            .set("group.id", group)
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", "10000")
            .set("fetch.wait.max.ms", "10")
            // A topic created after the subscription is found within 10 s (not 5 minutes).
            .set("topic.metadata.refresh.interval.ms", "10000");
        for (key, value) in settings {
            config.set(*key, *value);
        }
        config
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        let consumer: StreamConsumer = config
            .create()
            .map_err(|e| fail("cannot create the consumer".into(), e))?;
        check_reachable(bootstrap)
            .await
            .map_err(|e| fail("cannot reach the cluster".into(), e))?;
        consumer
            .subscribe(topics)
            .map_err(|e| fail(format!("cannot subscribe to {}", topics.join(", ")), e))?;
        Ok(KafkaSubscription {
            consumer,
            address: bootstrap.to_owned(),
            batch: 1,
            held: tokio::sync::Mutex::new(Held::default()),
        })
    }

    /// Applies up to `size` messages in one database transaction (see
    /// [`Consumer::receive_batch`](crate::Consumer::receive_batch)) and commits their offsets
    /// once: what has arrived is taken at once, up to `size`, without waiting for a batch to
    /// fill. 1, the default, is one transaction per message. At most 10,000: a size out of
    /// range is clamped, with a warning.
    pub fn batch(mut self, size: usize) -> KafkaSubscription {
        self.batch = super::batch_size("Kafka", size, 10_000);
        self
    }

    /// Processes messages until `shutdown` completes (the batch in hand is finished first), and
    /// reports what it did. While the database is unavailable it pauses (250 ms, doubling up to
    /// 5 s) and goes on; a consumer that must stop (a bug, a broker failure) returns the error.
    pub async fn run<DB: Backend, R: Routes<DB>>(
        &self,
        consumer: &Consumer<DB, R>,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<super::ConsumeReport, Error> {
        super::run_until(self, consumer, shutdown).await
    }

    /// Processes messages until none arrives for `idle`, and reports what it did. The group's
    /// first join can take seconds: give the first drain a long `idle`.
    ///
    /// A message that arrives before its aggregate's previous sequence was applied
    /// ([`Processed::Early`](crate::Processed::Early)) is held and tried again after the next
    /// batch and every quarter second, while the others go on; its partition's committed offset
    /// stays at it until it is processed.
    pub async fn drain<DB: Backend, R: Routes<DB>>(
        &self,
        consumer: &Consumer<DB, R>,
        idle: Duration,
    ) -> Result<super::ConsumeReport, Error> {
        use futures_util::FutureExt;
        let mut report = super::ConsumeReport::default();
        let mut held = self.held.lock().await;
        let mut quiet = Duration::ZERO;
        loop {
            let wait = if held.messages.is_empty() {
                idle
            } else {
                super::EARLY_RETRY.min(idle)
            };
            // librdkafka reconnects by itself: an error here (a broker restarting, a group
            // rebalancing) is reported and consuming goes on; only the consumer's own errors
            // stop it.
            let mut batch = match tokio::time::timeout(wait, self.consumer.recv()).await {
                Err(_) => {
                    quiet += wait;
                    self.retry_held(consumer, &mut held, &mut report).await?;
                    if quiet >= idle {
                        return Ok(report);
                    }
                    continue;
                }
                Ok(Ok(message)) => vec![message],
                Ok(Err(e)) => {
                    tracing::warn!(consumer = consumer.name(), error = %e, "Kafka consumer error; librdkafka retries");
                    continue;
                }
            };
            quiet = Duration::ZERO;
            while batch.len() < self.batch {
                match self.consumer.recv().now_or_never() {
                    Some(Ok(message)) => batch.push(message),
                    Some(Err(e)) => {
                        tracing::warn!(consumer = consumer.name(), error = %e, "Kafka consumer error; librdkafka retries");
                        break;
                    }
                    None => break,
                }
            }
            let early = match super::receive_batch(
                consumer,
                &batch,
                |m| m.payload().unwrap_or_default(),
                message_id,
                &mut report,
            )
            .await
            {
                Ok(early) => early,
                Err(e) => {
                    // Not committed, and already read: held, so that the next drain tries
                    // them again (the inbox finds what was committed a duplicate).
                    for m in &batch {
                        held.read(m);
                        held.messages.push(m.detach());
                    }
                    return Err(e);
                }
            };
            let had_held = !held.messages.is_empty();
            let mut partitions = Vec::new();
            for (m, early) in batch.iter().zip(early) {
                partitions.push(held.read(m));
                if early {
                    held.messages.push(m.detach());
                }
            }
            if had_held {
                // The batch may have applied what they waited for.
                self.retry_held(consumer, &mut held, &mut report).await?;
            }
            partitions.sort_unstable();
            partitions.dedup();
            self.commit(consumer, &held, &partitions);
        }
    }

    /// Tries the held messages again, keeps those still early, and commits the offsets they
    /// held back.
    async fn retry_held<DB: Backend, R: Routes<DB>>(
        &self,
        consumer: &Consumer<DB, R>,
        held: &mut Held,
        report: &mut super::ConsumeReport,
    ) -> Result<(), Error> {
        if held.messages.is_empty() {
            return Ok(());
        }
        let messages = std::mem::take(&mut held.messages);
        let early = super::receive_batch(
            consumer,
            &messages,
            |m| m.payload().unwrap_or_default(),
            message_id,
            report,
        )
        .await;
        let early = match early {
            Ok(early) => early,
            Err(e) => {
                held.messages = messages;
                return Err(e);
            }
        };
        let mut partitions: Vec<(String, i32)> = messages
            .iter()
            .map(|m| (m.topic().to_owned(), m.partition()))
            .collect();
        held.messages = messages
            .into_iter()
            .zip(early)
            .filter_map(|(m, early)| early.then_some(m))
            .collect();
        partitions.sort_unstable();
        partitions.dedup();
        self.commit(consumer, held, &partitions);
        Ok(())
    }

    /// Commits the offsets of `partitions` up to their first held message.
    fn commit<DB: Backend, R: Routes<DB>>(
        &self,
        consumer: &Consumer<DB, R>,
        held: &Held,
        partitions: &[(String, i32)],
    ) {
        let mut offsets = TopicPartitionList::new();
        for ((topic, partition), offset) in held.offsets(partitions) {
            if let Err(e) = offsets.add_partition_offset(&topic, partition, Offset::Offset(offset))
            {
                tracing::warn!(consumer = consumer.name(), error = %e, "could not name a Kafka offset to commit");
                return;
            }
        }
        if offsets.count() == 0 {
            return;
        }
        // A commit that fails (no coordinator while the broker restarts) is made good by the
        // next one; until then a restart redelivers, and the inbox finds duplicates.
        if let Err(e) = self.consumer.commit(&offsets, CommitMode::Async) {
            tracing::warn!(consumer = consumer.name(), error = %e, "could not commit Kafka offsets; the next batch commits them");
        }
    }
}

/// The `messageId` header (the event number), naming a body that cannot be read.
fn message_id(message: &impl Message) -> Option<String> {
    let headers = message.headers()?;
    headers
        .iter()
        .find(|h| h.key == "messageId")
        .and_then(|h| h.value)
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

impl super::Drain for KafkaSubscription {
    async fn drain_once<DB: Backend, R: Routes<DB>>(
        &self,
        consumer: &Consumer<DB, R>,
        idle: Duration,
    ) -> Result<super::ConsumeReport, Error> {
        self.drain(consumer, idle).await
    }
}
