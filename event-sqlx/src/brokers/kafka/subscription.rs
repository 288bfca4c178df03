//! Consuming from Kafka: a consumer group with auto-commit off, each partition's offset
//! committed only after the inbox transaction of the messages before it.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::ClientContext;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer as _, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers, Message};
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
    follow: Follow,
}

/// A topic and a partition.
type Partition = (String, i32);

/// How long a jump in a partition's offsets is read again before it is taken for offsets that
/// hold no record.
const JUMP_WAIT: Duration = Duration::from_millis(500);

/// Where the reading of each assigned partition stands, to notice a record batch passed over.
///
/// Offsets of a partition come one after the other, except where no record is (a compacted
/// topic, the markers of Kafka transactions). A broker that shows a batch before the batch at
/// the offsets below it is stored (Tansu 0.6.0 does, when several producers write one
/// partition) makes the consumer jump over records it will never fetch again: the partition's
/// committed offset then moves past records never applied. So when a record's offset is past
/// the one expected, the partition is read again from the offset expected, until that offset
/// has gone unread for [`JUMP_WAIT`]; only then are the offsets in between taken to hold no
/// record.
#[derive(Debug, Default)]
pub(super) struct Follow {
    /// The offset expected next, per partition read since it was assigned (or its committed
    /// offset, when the group had one).
    next: BTreeMap<Partition, i64>,
    /// A jump being read again, per partition.
    jumps: BTreeMap<Partition, Jump>,
}

/// A jump in a partition's offsets: `from` expected, not read since `since`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Jump {
    from: i64,
    since: Instant,
}

/// What a rebalance did to a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    /// Assigned, reading from the committed offset when the group has one.
    Assigned(Option<i64>),
    Revoked,
}

/// What to do with a record, by its offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// Process it.
    Take,
    /// Process it: the offsets `from..to` before it were read again for [`JUMP_WAIT`] and hold
    /// no record.
    TakePast { from: i64, to: i64 },
    /// Drop it, and the partition's records after it: read the partition again from this
    /// offset.
    Reread(i64),
}

impl Follow {
    /// A rebalance assigned or revoked `partition`.
    fn rebalanced(&mut self, partition: Partition, change: Change) {
        self.jumps.remove(&partition);
        match change {
            Change::Assigned(Some(offset)) => self.next.insert(partition, offset),
            Change::Assigned(None) | Change::Revoked => self.next.remove(&partition),
        };
    }

    /// What to do with the record at `offset` of `partition`, read at `now`.
    fn step(&mut self, partition: &Partition, offset: i64, now: Instant) -> Step {
        let step = match self.next.get(partition) {
            Some(&from) if offset > from => match self.jumps.get(partition) {
                // Whatever the record after the jump: `from` is what has not been read.
                Some(seen) if seen.from == from => {
                    if now.saturating_duration_since(seen.since) < JUMP_WAIT {
                        return Step::Reread(from);
                    }
                    Step::TakePast { from, to: offset }
                }
                _ => {
                    let jump = Jump { from, since: now };
                    self.jumps.insert(partition.clone(), jump);
                    return Step::Reread(from);
                }
            },
            _ => Step::Take,
        };
        self.jumps.remove(partition);
        // Set, not raised: a record below the offset expected comes after a seek back.
        self.next.insert(partition.clone(), offset + 1);
        step
    }
}

/// The consumer's context: the partitions each rebalance assigns or revokes, with the offsets
/// committed for those assigned, kept for the subscription to read before its next batch.
#[derive(Default)]
struct GroupContext {
    changes: Mutex<Vec<(Partition, Change)>>,
}

impl ClientContext for GroupContext {}

impl ConsumerContext for GroupContext {
    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let changes: Vec<(Partition, Change)> = match rebalance {
            Rebalance::Assign(assigned) => {
                // Where reading starts: the committed offsets, asked once per rebalance.
                let committed = consumer
                    .committed_offsets((*assigned).clone(), Duration::from_secs(2))
                    .map_err(|e| tracing::debug!(error = %e, "could not read the committed offsets of the partitions assigned"))
                    .ok();
                assigned
                    .elements()
                    .iter()
                    .map(|e| {
                        let partition = (e.topic().to_owned(), e.partition());
                        let start = committed.as_ref().and_then(|c| {
                            match c.find_partition(e.topic(), e.partition())?.offset() {
                                Offset::Offset(offset) => Some(offset),
                                _ => None,
                            }
                        });
                        (partition, Change::Assigned(start))
                    })
                    .collect()
            }
            Rebalance::Revoke(revoked) => revoked
                .elements()
                .iter()
                .map(|e| ((e.topic().to_owned(), e.partition()), Change::Revoked))
                .collect(),
            Rebalance::Error(_) => return,
        };
        self.changes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(changes);
    }
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
struct GroupConsumer(Option<StreamConsumer<GroupContext>>);

impl std::ops::Deref for GroupConsumer {
    type Target = StreamConsumer<GroupContext>;

    fn deref(&self) -> &StreamConsumer<GroupContext> {
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
        let consumer: StreamConsumer<GroupContext> = config
            .create_with_context(GroupContext::default())
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
    ///
    /// A record whose offset is past the one after the record before it in its partition makes
    /// the partition be read again from the offset expected, until that offset has gone unread
    /// for half a second: a broker that shows a record batch before the batch at the offsets
    /// below it is stored (Tansu 0.6.0, with several producers on one partition) would
    /// otherwise have records passed over for good. Offsets that hold no record (a compacted
    /// topic, transaction markers) cost that half second each.
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
        let mut holding = None;
        loop {
            let wait = if held.messages.is_empty() {
                idle
            } else {
                crate::brokers::EARLY_RETRY.min(idle)
            };
            let next = match self.consumer.recv().now_or_never() {
                Some(next) => Ok(next),
                None => {
                    // Nothing waiting: the consumer's connection goes back to the pool while
                    // the topic is quiet.
                    holding = None;
                    tokio::time::timeout(wait, self.consumer.recv()).await
                }
            };
            // librdkafka reconnects by itself: an error here (a broker restarting, a group
            // rebalancing) is reported and consuming goes on; only the consumer's own errors
            // stop it.
            let mut batch = match next {
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
            let batch = self.follow(consumer, &mut held.follow, batch);
            if batch.is_empty() {
                continue;
            }
            holding.get_or_insert_with(|| consumer.hold_connection());
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

    /// The records of `batch` to process: a partition whose offsets jump is read again from the
    /// offset expected (see [`Follow`]), and its records from the jump on are dropped.
    fn follow<'m, DB: Backend, R: Routes<DB>>(
        &self,
        consumer: &Consumer<DB, R>,
        follow: &mut Follow,
        batch: Vec<BorrowedMessage<'m>>,
    ) -> Vec<BorrowedMessage<'m>> {
        let changes = std::mem::take(
            &mut *self
                .consumer
                .context()
                .changes
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for (partition, change) in changes {
            follow.rebalanced(partition, change);
        }
        let now = Instant::now();
        let mut reread: Vec<Partition> = Vec::new();
        batch
            .into_iter()
            .filter(|m| {
                let partition = (m.topic().to_owned(), m.partition());
                if reread.contains(&partition) {
                    return false;
                }
                match follow.step(&partition, m.offset(), now) {
                    Step::Take => true,
                    Step::TakePast { from, to } => {
                        tracing::warn!(
                            consumer = consumer.name(),
                            topic = m.topic(),
                            partition = m.partition(),
                            "offsets {from} to {} hold no record after {JUMP_WAIT:?} of reading \
                             again (a compacted topic, or transaction markers); going on",
                            to - 1
                        );
                        true
                    }
                    Step::Reread(from) => {
                        tracing::debug!(
                            consumer = consumer.name(),
                            topic = m.topic(),
                            partition = m.partition(),
                            expected = from,
                            got = m.offset(),
                            "offsets jumped; reading the partition again from the offset expected"
                        );
                        // Timeout zero: the seek is started, and the next fetch reads from
                        // there. One that fails (the partition was just revoked) leaves the
                        // partition to its next owner, from the committed offset, which is not
                        // past the jump.
                        if let Err(e) =
                            self.consumer
                                .seek(m.topic(), m.partition(), Offset::Offset(from), Duration::ZERO)
                        {
                            tracing::debug!(consumer = consumer.name(), error = %e, "could not read a partition again");
                        }
                        reread.push(partition);
                        false
                    }
                }
            })
            .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> Partition {
        ("orders".to_owned(), 1)
    }

    #[test]
    fn offsets_one_after_the_other_are_taken() {
        let (mut follow, now) = (Follow::default(), Instant::now());
        for offset in 7..10 {
            assert_eq!(follow.step(&p(), offset, now), Step::Take);
        }
        assert_eq!(follow.next.get(&p()), Some(&10));
    }

    #[test]
    fn a_jump_is_read_again_until_it_has_stood_for_the_wait() {
        let (mut follow, start) = (Follow::default(), Instant::now());
        assert_eq!(follow.step(&p(), 270, start), Step::Take);
        // 271..335 passed over: read again from 271, and again while the jump is young.
        assert_eq!(follow.step(&p(), 335, start), Step::Reread(271));
        let young = start + JUMP_WAIT / 2;
        assert_eq!(follow.step(&p(), 335, young), Step::Reread(271));
        // The same jump after the wait: offsets without records.
        let old = start + JUMP_WAIT;
        assert_eq!(
            follow.step(&p(), 335, old),
            Step::TakePast { from: 271, to: 335 }
        );
        assert_eq!(follow.step(&p(), 336, old), Step::Take);
        assert!(follow.jumps.is_empty());
    }

    #[test]
    fn a_batch_that_arrives_on_reading_again_ends_the_jump() {
        let (mut follow, start) = (Follow::default(), Instant::now());
        assert_eq!(follow.step(&p(), 270, start), Step::Take);
        assert_eq!(follow.step(&p(), 335, start), Step::Reread(271));
        for offset in 271..=335 {
            assert_eq!(follow.step(&p(), offset, start), Step::Take, "{offset}");
        }
        assert!(follow.jumps.is_empty());
        // A later jump waits its own time.
        let later = start + JUMP_WAIT * 3;
        assert_eq!(follow.step(&p(), 400, later), Step::Reread(336));
    }

    #[test]
    fn the_wait_counts_from_the_first_jump_whatever_comes_after_it() {
        let (mut follow, start) = (Follow::default(), Instant::now());
        assert_eq!(follow.step(&p(), 10, start), Step::Take);
        assert_eq!(follow.step(&p(), 30, start), Step::Reread(11));
        // Records after the jump keep coming (the seek back has not taken effect yet, or
        // part of the gap was stored): still the jump from 11.
        assert_eq!(
            follow.step(&p(), 31, start + JUMP_WAIT / 2),
            Step::Reread(11)
        );
        assert_eq!(
            follow.step(&p(), 20, start + JUMP_WAIT),
            Step::TakePast { from: 11, to: 20 }
        );
        // Offset 11 read: the jump is over, and a later one waits its own time.
        let mut follow = Follow::default();
        assert_eq!(follow.step(&p(), 10, start), Step::Take);
        assert_eq!(follow.step(&p(), 30, start), Step::Reread(11));
        assert_eq!(follow.step(&p(), 11, start + JUMP_WAIT), Step::Take);
        assert_eq!(follow.step(&p(), 13, start + JUMP_WAIT), Step::Reread(12));
    }

    #[test]
    fn reading_starts_at_the_committed_offset_of_a_partition_assigned() {
        let (mut follow, now) = (Follow::default(), Instant::now());
        follow.rebalanced(p(), Change::Assigned(Some(271)));
        assert_eq!(follow.step(&p(), 335, now), Step::Reread(271));
        // Revoked, then assigned with no committed offset: the first record sets the start.
        follow.rebalanced(p(), Change::Revoked);
        assert!(follow.jumps.is_empty());
        follow.rebalanced(p(), Change::Assigned(None));
        assert_eq!(follow.step(&p(), 335, now), Step::Take);
        // A record below the offset expected (after a seek back) is taken, and reading
        // follows from it.
        assert_eq!(follow.step(&p(), 300, now), Step::Take);
        assert_eq!(follow.step(&p(), 302, now), Step::Reread(301));
    }
}
