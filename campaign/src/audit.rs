//! When committed events have no effect, where they went: whether the broker holds them, and
//! where the consumers' group stands. Run only after a failed check, while the broker is up.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::{Headers as _, Message as _};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// How long the audit reads the topic at most.
const READ_LIMIT: Duration = Duration::from_secs(60);

/// The topic is read to its end when no record arrives for this long. Not the high watermark:
/// Tansu 0.6.0 reports the base offset of its last stored batch plus one, short of the end.
const QUIET: Duration = Duration::from_secs(3);

/// Reads the whole topic `topic` from its first offset and says, for the events of `lost`
/// (event numbers, the records' `messageId`), at which partition and offset the broker holds
/// them, or that it does not; and the offsets the group `group` committed beside the offset
/// after each partition's last record.
pub(crate) async fn kafka(
    bootstrap: &str,
    topic: &str,
    group: &str,
    lost: &[String],
) -> anyhow::Result<Vec<String>> {
    let bootstrap = bootstrap.to_owned();
    let topic = topic.to_owned();
    let group = group.to_owned();
    let lost: HashSet<String> = lost.iter().cloned().collect();
    tokio::task::spawn_blocking(move || read_kafka(&bootstrap, &topic, &group, &lost)).await?
}

fn read_kafka(
    bootstrap: &str,
    topic: &str,
    group: &str,
    lost: &HashSet<String>,
) -> anyhow::Result<Vec<String>> {
    let config = |group: &str| {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", bootstrap)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("log_level", "3");
        config
    };
    // Only read: this consumer never joins the group, so it moves none of its offsets.
    let reader: BaseConsumer = config("event-campaign-audit").create()?;
    let timeout = Duration::from_secs(10);
    let metadata = reader.fetch_metadata(Some(topic), timeout)?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    let mut assignment = TopicPartitionList::new();
    for &p in &partitions {
        // Offset 0, not `Offset::Beginning`: Tansu 0.6.0 answers "earliest" with the batch
        // stored first in time, which need not be the first.
        assignment.add_partition_offset(topic, p, Offset::Offset(0))?;
    }
    reader.assign(&assignment)?;

    let mut found = Vec::new();
    let mut read: BTreeMap<i32, i64> = BTreeMap::new();
    let started = std::time::Instant::now();
    let mut last_record = started;
    let ended = loop {
        if last_record.elapsed() >= QUIET {
            break true;
        }
        if started.elapsed() >= READ_LIMIT {
            break false;
        }
        let Some(message) = reader.poll(Duration::from_millis(250)) else {
            continue;
        };
        let Ok(message) = message else { continue };
        last_record = std::time::Instant::now();
        read.insert(message.partition(), message.offset() + 1);
        let id = message.headers().and_then(|h| {
            h.iter()
                .find(|h| h.key == "messageId")
                .and_then(|h| h.value)
                .map(|v| String::from_utf8_lossy(v).into_owned())
        });
        if let Some(id) = id.filter(|id| lost.contains(id)) {
            found.push(format!(
                "{id} at {}:{}",
                message.partition(),
                message.offset()
            ));
        }
    };

    let committed = config(group)
        .create::<BaseConsumer>()?
        .committed_offsets(assignment, timeout)?;
    let positions: Vec<String> = committed
        .elements()
        .iter()
        .map(|e| {
            let at = match e.offset() {
                Offset::Offset(o) => o.to_string(),
                other => format!("{other:?}"),
            };
            let end = read.get(&e.partition()).copied().unwrap_or(0);
            format!(
                "partition {}: committed {at}, records to {end}",
                e.partition()
            )
        })
        .collect();
    let mut lines = vec![
        format!(
            "audit of topic {topic}: {} of the {} lost events are in the topic{}",
            found.len(),
            lost.len(),
            if found.is_empty() {
                String::new()
            } else {
                format!(
                    " ({})",
                    found
                        .iter()
                        .take(10)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        ),
        format!("group {group}: {}", positions.join(", ")),
    ];
    if !ended {
        lines.push(format!(
            "the audit stopped reading after {} s, before the topic's end",
            READ_LIMIT.as_secs()
        ));
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _};
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    use rdkafka::{ClientConfig, Offset, TopicPartitionList};

    /// The audit finds which lost events the topic holds and where, says which it does not,
    /// and reports the group's committed offset beside the partition's end.
    #[tokio::test]
    async fn the_audit_says_which_lost_events_the_topic_holds_and_where_the_group_stands() {
        let Some(publisher) = event_tests::any_broker::kafka().await else {
            return;
        };
        let url = event_tests::db::kafka_url();
        let topic = event_tests::db::unique("audit");
        publisher.ensure_topic(&topic, 1).await.unwrap();
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", &url)
            .create()
            .unwrap();
        for id in ["e-1", "e-2", "e-3"] {
            let headers = OwnedHeaders::new().insert(Header {
                key: "messageId",
                value: Some(id),
            });
            producer
                .send(
                    FutureRecord::to(&topic)
                        .key("a")
                        .payload("{}")
                        .headers(headers),
                    std::time::Duration::from_secs(10),
                )
                .await
                .map_err(|(e, _)| e)
                .unwrap();
        }
        let group = event_tests::db::unique("audit_group");
        let committer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &url)
            .set("group.id", &group)
            .create()
            .unwrap();
        let mut offsets = TopicPartitionList::new();
        offsets
            .add_partition_offset(&topic, 0, Offset::Offset(1))
            .unwrap();
        committer.commit(&offsets, CommitMode::Sync).unwrap();

        let lost = vec!["e-2".to_owned(), "never-published".to_owned()];
        let lines = super::kafka(&url, &topic, &group, &lost).await.unwrap();
        assert_eq!(
            lines,
            vec![
                format!(
                    "audit of topic {topic}: 1 of the 2 lost events are in the topic (e-2 at 0:1)"
                ),
                format!("group {group}: partition 0: committed 1, records to 3"),
            ]
        );
    }
}
