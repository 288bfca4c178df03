//! `eventctl relay` as its own process, publishing to NATS JetStream, RabbitMQ and Kafka: killed
//! mid-drain (SIGKILL), then a second one finishes, and every event is in the stream, queue or
//! topic.

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use event_tests::db::{TestDb, amqp_url, kafka_url, nats_url, reachable, unique};
use event_tests::fixtures::{Order, commit_orders, orders_to};

const EVENTS: usize = 120;

/// A SQLite outbox with `EVENTS` orders placed, each routed to `topic` / `order.placed`.
async fn outbox_for(topic: &str) -> TestDb<sqlx::Sqlite> {
    let db = TestDb::sqlite().await.unwrap();
    let outbox = orders_to(db.pool(), topic);
    commit_orders(
        &outbox,
        (0..EVENTS).map(|i| Order::place(&format!("o-{i}"), 1).unwrap()),
    )
    .await;
    db
}

fn relay(db: &TestDb<sqlx::Sqlite>, publisher: &str, extra: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_eventctl"));
    command
        .args(["relay", "--database-url", &db.url, "--publisher", publisher])
        .args(["--lease-secs", "2", "--batch-size", "10"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command
}

/// Asserts that the relay process exited 0, showing its stderr if not.
fn succeeded(out: &std::process::Output) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
}

/// Starts a relay that publishes slowly, waits until `published()` says it got going, and
/// kills it (SIGKILL) while it holds leases.
async fn start_and_kill(
    db: &TestDb<sqlx::Sqlite>,
    publisher: &str,
    extra: &[&str],
    published: impl AsyncFn() -> usize,
) -> usize {
    let mut args = vec!["--max-rate", "100", "--instance-id", "victim"];
    args.extend_from_slice(extra);
    let mut victim = relay(db, publisher, &args).spawn().unwrap();
    let started = Instant::now();
    let seen = loop {
        let seen = published().await;
        if seen >= 10 && db.counts().await.in_progress > 0 {
            break seen;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = victim.kill();
            let _ = victim.wait();
            panic!("the relay never got going");
        }
        // Polling the other process, with the deadline above.
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    victim.kill().unwrap();
    victim.wait().unwrap();
    seen
}

/// A second relay drains what is left: it waits out the victim's leases, recovers them and
/// publishes them at once.
fn finish(db: &TestDb<sqlx::Sqlite>, publisher: &str) {
    let out = relay(
        db,
        publisher,
        &[
            "--until-idle",
            "--recovery-delay",
            "0",
            "--instance-id",
            "rescuer",
        ],
    )
    .output()
    .unwrap();
    succeeded(&out);
}

/// A JetStream context, the stream of a fresh topic (created by the relay under test) and its
/// subjects, the NATS URL, and an outbox of `EVENTS` orders routed to the topic; `None` when
/// NATS is unreachable (the test skips).
async fn jetstream_outbox() -> Option<(
    async_nats::jetstream::Context,
    String,
    String,
    String,
    TestDb<sqlx::Sqlite>,
)> {
    let url = nats_url();
    let client = reachable("NATS", &url, async_nats::connect(&url).await)?;
    let topic = unique("relay").replace('_', "-");
    let stream = topic.replace('-', "_").to_uppercase();
    let subjects = format!("{topic}.>");
    let db = outbox_for(&topic).await;
    Some((
        async_nats::jetstream::new(client),
        stream,
        subjects,
        url,
        db,
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_relay_process_and_a_second_one_fill_the_jetstream_stream() {
    let Some((js, stream, subjects, url, db)) = jetstream_outbox().await else {
        return;
    };
    let js = &js;
    let extra = ["--stream", stream.as_str(), "--subject", subjects.as_str()];
    let messages = async || -> usize {
        match js.get_stream(&stream).await {
            Ok(mut s) => s.info().await.map_or(0, |i| i.state.messages as usize),
            Err(_) => 0,
        }
    };
    let before = start_and_kill(&db, &url, &extra, messages).await;
    assert!(before < EVENTS, "killed before the end");
    finish(&db, &url);

    assert_eq!(db.counts().await.succeeded, EVENTS as i64);
    // JetStream dropped the events the victim had sent and the rescuer sent again
    // (Nats-Msg-Id = event number): each is in the stream once.
    assert_eq!(messages().await, EVENTS);
    js.delete_stream(&stream).await.unwrap();
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_relay_process_and_a_second_one_fill_the_rabbitmq_queue() {
    use lapin::options::{BasicGetOptions, QueueBindOptions, QueueDeclareOptions};
    use lapin::types::{FieldTable, ShortString};

    let url = amqp_url();
    let Some(connection) = reachable(
        "RabbitMQ",
        &url,
        lapin::Connection::connect(&url, lapin::ConnectionProperties::default()).await,
    ) else {
        return;
    };
    let channel = connection.create_channel().await.unwrap();
    let exchange = unique("relay").replace('_', "-");
    let queue = format!("{exchange}-all");
    let db = outbox_for(&exchange).await;
    let extra = ["--exchange", exchange.as_str()];
    // The exchange exists once the first relay declared it; bind the queue then.
    let declared = async || -> bool {
        channel
            .queue_declare(
                ShortString::from(queue.as_str()),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .is_ok()
    };
    assert!(declared().await);
    // Declared here too, so that nothing published is lost before the binding exists.
    let setup = event_sqlx::RabbitMqPublisher::connect(&url).await.unwrap();
    setup.declare_exchange(&exchange).await.unwrap();
    channel
        .queue_bind(
            ShortString::from(queue.as_str()),
            ShortString::from(exchange.as_str()),
            ShortString::from("#"),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let queued = async || -> usize {
        channel
            .queue_declare(
                ShortString::from(queue.as_str()),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_or(0, |q| q.message_count() as usize)
    };
    let before = start_and_kill(&db, &url, &extra, queued).await;
    assert!(before < EVENTS, "killed before the end");
    finish(&db, &url);
    assert_eq!(db.counts().await.succeeded, EVENTS as i64);

    // At least once: every event is in the queue; one the victim published without marking it
    // is there twice, and consumers deduplicate it on eventId.
    let mut ids = HashSet::new();
    while let Some(message) = channel
        .basic_get(
            ShortString::from(queue.as_str()),
            BasicGetOptions { no_ack: true },
        )
        .await
        .unwrap()
    {
        let envelope: event_core::EventEnvelope =
            serde_json::from_slice(&message.delivery.data).unwrap();
        ids.insert(envelope.event_id.to_string());
    }
    assert_eq!(ids.len(), EVENTS);
    channel
        .queue_delete(
            ShortString::from(queue.as_str()),
            lapin::options::QueueDeleteOptions::default(),
        )
        .await
        .unwrap();
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_relay_process_and_a_second_one_fill_the_kafka_topic() {
    use event_sqlx::{Consumer, Delivered, KafkaPublisher, KafkaSubscription};
    use event_tests::fixtures::OrderPlaced;

    let url = kafka_url();
    if reachable("Kafka", &url, KafkaPublisher::connect(&url).await).is_none() {
        return;
    }
    let topic = unique("relay").replace('_', "-");
    let db = outbox_for(&topic).await;
    let publisher = format!("kafka://{url}");
    let extra = ["--topic", topic.as_str(), "--partitions", "3"];
    // A consumer group's first join takes seconds: the victim's progress is read from the
    // outbox instead.
    let before = start_and_kill(&db, &publisher, &extra, async || {
        db.counts().await.succeeded as usize
    })
    .await;
    assert!(before < EVENTS, "killed before the end");
    finish(&db, &publisher);
    assert_eq!(db.counts().await.succeeded, EVENTS as i64);

    // Subscribed once the topic exists. What the relays wrote, read back through a consumer group into an inbox: one row per
    // distinct event.
    let subscription = KafkaSubscription::subscribe(&url, &unique("check"), &[topic.as_str()])
        .await
        .unwrap()
        .batch(100);
    let consumer = Consumer::new(db.pool().clone(), "check", "1.0.0")
        .on(async |_tx: &mut sqlx::SqliteConnection, _placed: Delivered<OrderPlaced>| Ok(()));
    let consumed = async || -> usize {
        let _ = subscription
            .drain(&consumer, Duration::from_millis(200))
            .await;
        sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM consumed_event WHERE consumer = 'check'")
            .fetch_one(db.pool())
            .await
            .unwrap() as usize
    };
    event_tests::wait::until(Duration::from_secs(60), async || match consumed().await {
        n if n == EVENTS => Ok(()),
        n => Err(format!("{n} of {EVENTS} events consumed")),
    })
    .await;
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_format_publishes_cloudevents_and_names_its_values() {
    let Some((js, stream, subjects, url, db)) = jetstream_outbox().await else {
        return;
    };
    let js = &js;
    let out = relay(
        &db,
        &url,
        &["--until-idle", "--stream", &stream, "--subject", &subjects],
    )
    .args(["--format", "structured"])
    .output()
    .unwrap();
    succeeded(&out);
    assert_eq!(db.counts().await.succeeded, EVENTS as i64);
    let first = event_tests::any_broker::first_message(js, &stream).await;
    let content_type = first
        .headers
        .get("content-type")
        .map(|v| v.as_str().to_owned());
    assert_eq!(
        content_type.as_deref(),
        Some("application/cloudevents+json; charset=UTF-8")
    );
    let event: serde_json::Value = serde_json::from_slice(&first.payload).unwrap();
    assert_eq!(event["specversion"], "1.0");
    assert_eq!(event["type"], "ORDER_PLACED");
    js.delete_stream(&stream).await.unwrap();

    // A format for a publisher that writes envelopes, and a format that does not exist.
    let out = relay(&db, "stdout", &["--until-idle", "--format", "binary"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("--format binary goes with a broker publisher"),
        "{stderr}"
    );
    let out = relay(&db, "stdout", &["--format", "avro"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("unknown wire format `avro`: use envelope")
            && stderr.contains("binary (CloudEvents binary mode)"),
        "{stderr}"
    );
    db.cleanup().await;
}
