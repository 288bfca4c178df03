//! rdkafka alone, no toolkit code: does a Kafka-protocol broker ever show a consumer a record
//! batch before the batch at the offsets just below it is readable?
//!
//! ```sh
//! cargo run --release -p event-campaign --example kafka_offset_gaps -- 127.0.0.1:19092 [--reread]
//! ```
//!
//! It creates a topic of one partition, writes it from several idempotent producers at once
//! (each its own connection, as the relays of one outbox are), and reads the partition with a
//! consumer that follows the writers. Each time the offset of a record is not the one after the
//! record before it, the consumer notes the offsets it passed over. When the writers are done, a
//! second consumer reads the partition again from offset 0, and the program prints how many of the
//! passed-over offsets hold a record after all: records the following consumer never saw.
//!
//! Apache Kafka never shows a consumer an offset above its high watermark, which moves only past
//! stored batches: the count is 0 there. Tansu 0.6.0 reserves a batch's offsets before it stores
//! the batch, and answers a fetch with the first stored batch at or past the offset asked for.
//!
//! With `--reread`, the following consumer seeks back to the first offset it passed over, once
//! for each jump, as `KafkaSubscription` does: the jumps it then still passes over are counted
//! the same way.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::Message as _;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// Producers writing the partition at once.
const WRITERS: usize = 3;
/// Records each producer writes.
const RECORDS: usize = 6_000;
/// Records each producer writes before a short pause, as a relay writes a batch.
const BURST: usize = 20;
/// Rounds, each on a topic of its own: the defect shows in some rounds, not all.
const ROUNDS: usize = 10;
/// Reading stops when no record came for this long.
const QUIET: Duration = Duration::from_secs(3);

fn config(bootstrap: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("log_level", "3");
    config
}

/// A consumer of partition 0 of `topic` from offset 0, outside any group's offsets.
fn reader(bootstrap: &str, topic: &str) -> anyhow::Result<BaseConsumer> {
    let consumer: BaseConsumer = config(bootstrap)
        .set("group.id", "kafka-offset-gaps")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "10")
        .create()?;
    let mut assignment = TopicPartitionList::new();
    // Offset 0, not "earliest": Tansu 0.6.0 answers "earliest" from the batch stored first.
    assignment.add_partition_offset(topic, 0, Offset::Offset(0))?;
    consumer.assign(&assignment)?;
    Ok(consumer)
}

/// What the consumer that followed the writers saw.
#[derive(Default)]
struct Followed {
    received: usize,
    passed_over: BTreeSet<i64>,
    jumps: usize,
    rereads: usize,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let bootstrap = args.next().unwrap_or_else(|| "127.0.0.1:19092".into());
    let reread = args.next().as_deref() == Some("--reread");
    let (mut rounds_missing, mut missed_total) = (0, 0);
    for round in 1..=ROUNDS {
        let missed = play(&bootstrap, reread, round).await?;
        rounds_missing += usize::from(missed > 0);
        missed_total += missed;
    }
    println!(
        "{rounds_missing} of {ROUNDS} rounds: the following consumer never saw {missed_total} \
         records the partition holds"
    );
    Ok(())
}

/// One round on a topic of its own; returns how many stored records the follower never saw.
async fn play(bootstrap: &str, reread: bool, round: usize) -> anyhow::Result<usize> {
    let bootstrap = bootstrap.to_owned();
    let topic = format!("offset-gaps-{}-{round}", std::process::id());
    let admin: AdminClient<DefaultClientContext> = config(&bootstrap).create()?;
    admin
        .create_topics(
            [&NewTopic::new(&topic, 1, TopicReplication::Fixed(-1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await?;

    // The follower: reads while the writers write, noting the offsets it passes over; with
    // `reread`, it seeks back to the first offset passed over, once per jump.
    let follower = {
        let (bootstrap, topic) = (bootstrap.clone(), topic.clone());
        tokio::task::spawn_blocking(move || -> anyhow::Result<Followed> {
            let consumer = reader(&bootstrap, &topic)?;
            let mut followed = Followed::default();
            let mut next = 0;
            let mut reread_at = None;
            let mut last = Instant::now();
            while last.elapsed() < QUIET {
                let Some(message) = consumer.poll(Duration::from_millis(100)) else {
                    continue;
                };
                let offset = message?.offset();
                last = Instant::now();
                followed.received += 1;
                if offset > next {
                    followed.jumps += 1;
                    if reread && reread_at != Some(next) {
                        reread_at = Some(next);
                        followed.rereads += 1;
                        consumer.seek(&topic, 0, Offset::Offset(next), Duration::from_secs(5))?;
                        continue;
                    }
                    followed.passed_over.extend(next..offset);
                }
                next = next.max(offset + 1);
            }
            Ok(followed)
        })
    };

    let started = Instant::now();
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let producer: FutureProducer = config(&bootstrap)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "1")
            .create()?;
        let topic = topic.clone();
        writers.push(tokio::spawn(async move {
            let mut pending = Vec::with_capacity(RECORDS);
            for i in 0..RECORDS {
                let value = format!("{w}:{i}");
                let record = FutureRecord::to(&topic)
                    .partition(0)
                    .key("k")
                    .payload(&value);
                pending.push(producer.send_result(record).map_err(|(e, _)| e)?);
                if i % BURST == BURST - 1 {
                    // A relay's batch, then a pause: the follower keeps up with the writers.
                    tokio::time::sleep(Duration::from_millis(2 + (i / BURST % 3) as u64)).await;
                }
            }
            for delivery in pending {
                delivery.await?.map_err(|(e, _)| e)?;
            }
            producer.flush(Duration::from_secs(10))?;
            anyhow::Ok(())
        }));
    }
    for writer in writers {
        writer.await??;
    }
    let written = WRITERS * RECORDS;
    let writing = started.elapsed().as_secs_f64();

    let Followed {
        received: seen,
        passed_over,
        jumps,
        rereads,
    } = follower.await??;
    // Read again from offset 0, after every write is acknowledged.
    let stored = tokio::task::spawn_blocking(move || -> anyhow::Result<BTreeSet<i64>> {
        let consumer = reader(&bootstrap, &topic)?;
        let mut offsets = BTreeSet::new();
        let mut last = Instant::now();
        while last.elapsed() < QUIET {
            if let Some(message) = consumer.poll(Duration::from_millis(100)) {
                offsets.insert(message?.offset());
                last = Instant::now();
            }
        }
        Ok(offsets)
    })
    .await??;
    let missed: Vec<i64> = passed_over.intersection(&stored).copied().collect();
    print!(
        "round {round}: {written} records written by {WRITERS} producers in {writing:.2} s, \
         {} read again from offset 0; the follower received {seen}, {jumps} jumps in offsets \
         ({rereads} read again), {} offsets passed over, {} of them hold a record it never saw",
        stored.len(),
        passed_over.len(),
        missed.len()
    );
    match (missed.first(), missed.last()) {
        (Some(first), Some(last)) => println!(" (offsets {first} to {last})"),
        _ => println!(),
    }
    Ok(missed.len())
}
