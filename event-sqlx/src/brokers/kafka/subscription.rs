//! Consuming from Kafka: a consumer group with auto-commit off, each partition's offset
//! committed only after the inbox transaction of the messages before it.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer as _, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use crate::consumer::Consumer;
use crate::error::Error;
use crate::route::Routes;
use crate::sql::dialect::Backend;

use super::{check_reachable, client_config};

/// A Kafka consumer group feeding a [`Consumer`](crate::Consumer): offsets are committed only
/// after the inbox transaction of the messages before them committed (auto-commit is off), so
/// a process that dies redelivers what it had not committed, and the inbox turns each
/// redelivery into a duplicate. Messages of one partition are processed in order.
///
/// Dropping it leaves the group on a thread of its own: the drop returns at once, even while the
/// broker is silent.
pub struct KafkaSubscription {
    consumer: GroupConsumer,
    address: String,
    batch: usize,
    held: tokio::sync::Mutex<Held>,
}

/// Messages held back because they arrived before their aggregate's previous sequence was
/// applied, and the next offset processed per partition; the offset committed for a partition
/// stops at its first held message.
#[derive(Debug, Default)]
pub(super) struct Held {
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

/// The group consumer, closed on a thread of its own when dropped: librdkafka's close leaves the
/// group and waits for the coordinator's answer without a bound, so a silent broker would
/// otherwise hold the thread that drops the subscription (an async worker) for good.
struct GroupConsumer(Option<StreamConsumer>);

impl std::ops::Deref for GroupConsumer {
    type Target = StreamConsumer;

    fn deref(&self) -> &StreamConsumer {
        // Taken only in `drop`.
        self.0
            .as_ref()
            .expect("the consumer is present until dropped")
    }
}

impl Drop for GroupConsumer {
    fn drop(&mut self) {
        if let Some(consumer) = self.0.take() {
            // If no thread can be started, the closure, and the consumer with it, is dropped
            // here: the wait is then the caller's, as without this.
            let _ = std::thread::Builder::new()
                .name("kafka-consumer-close".into())
                .spawn(move || drop(consumer));
        }
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
            consumer: GroupConsumer(Some(consumer)),
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
        self.batch = crate::brokers::batch_size("Kafka", size, 10_000);
        self
    }

    /// Processes messages until `shutdown` completes (the batch in hand is finished first), and
    /// reports what it did. While the database is unavailable it pauses (250 ms, doubling up to
    /// 5 s) and goes on; a consumer that must stop (a bug, a broker failure) returns the error.
    pub async fn run<DB: Backend, R: Routes<DB>>(
        &self,
        consumer: &Consumer<DB, R>,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<crate::brokers::ConsumeReport, Error> {
        crate::brokers::run_until(self, consumer, shutdown).await
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
        idle: Duration,
        report: &mut crate::brokers::ConsumeReport,
    ) -> Result<(), Error> {
        use futures_util::FutureExt;
        let mut held = self.held.lock().await;
        let mut quiet = Duration::ZERO;
        loop {
            let wait = if held.messages.is_empty() {
                idle
            } else {
                crate::brokers::EARLY_RETRY.min(idle)
            };
            // librdkafka reconnects by itself: an error here (a broker restarting, a group
            // rebalancing) is reported and consuming goes on; only the consumer's own errors
            // stop it.
            let mut batch = match tokio::time::timeout(wait, self.consumer.recv()).await {
                Err(_) => {
                    quiet += wait;
                    self.retry_held(consumer, &mut held, report).await?;
                    if quiet >= idle {
                        return Ok(());
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
            let early =
                match crate::brokers::receive_batch(consumer, &batch, source(), report).await {
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
                self.retry_held(consumer, &mut held, report).await?;
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
        report: &mut crate::brokers::ConsumeReport,
    ) -> Result<(), Error> {
        if held.messages.is_empty() {
            return Ok(());
        }
        let messages = std::mem::take(&mut held.messages);
        let early = crate::brokers::receive_batch(consumer, &messages, source(), report).await;
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

/// How `receive_batch` reads a record.
fn source<'f, M: Message>() -> crate::brokers::Source<'f, M> {
    crate::brokers::Source {
        system: "kafka",
        inbound: &inbound,
        id: &message_id,
        destination: &|m: &M| m.topic().to_owned(),
    }
}

/// What a CloudEvent needs of a record: its value, the `content-type` header and the
/// attributes of its `ce_` headers.
pub(super) fn inbound(message: &impl Message) -> crate::wire::Inbound<'_> {
    let headers = message.headers();
    let text = |v: Option<&[u8]>| String::from_utf8_lossy(v.unwrap_or_default()).into_owned();
    crate::wire::Inbound {
        body: message.payload().unwrap_or_default(),
        content_type: headers.and_then(|h| {
            h.iter()
                .find(|h| h.key.eq_ignore_ascii_case("content-type"))
                .map(|h| text(h.value))
        }),
        attributes: headers
            .map(|h| {
                let values = h.iter().map(|h| (h.key, h.value));
                crate::brokers::ce_attributes(values, &["ce_"], |v| Some(text(v)))
            })
            .unwrap_or_default(),
    }
}

/// The `messageId` header (the event number), naming a body that cannot be read.
pub(super) fn message_id(message: &impl Message) -> Option<String> {
    let headers = message.headers()?;
    headers
        .iter()
        .find(|h| h.key == "messageId")
        .and_then(|h| h.value)
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

impl crate::brokers::Drain for KafkaSubscription {
    async fn drain_once<DB: Backend, R: Routes<DB>>(
        &self,
        consumer: &Consumer<DB, R>,
        idle: std::time::Duration,
        report: &mut crate::brokers::ConsumeReport,
    ) -> Result<(), Error> {
        self.drain_into(consumer, idle, report).await
    }
}
