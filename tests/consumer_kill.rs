//! A batched consumer process killed (SIGKILL) in the middle of a batch transaction, on each
//! broker: after a second process takes over, every event is applied exactly once; none twice,
//! none lost.

use std::process::{Command, Stdio};
use std::time::Duration;

use event_sqlx::{
    KafkaPublisher, NatsPublisher, Outbox, Publisher, RabbitMqPublisher, RabbitMqSubscription,
    RelayConfig,
};
use event_tests::any_broker::stream_for;
use event_tests::background::Process;
use event_tests::db::{TestDb, amqp_url, kafka_url, nats_url, reachable, unique};
use event_tests::fixtures::{Order, commit_orders, orders_to};
use event_tests::wait;
use sqlx::Postgres;

const EVENTS: i64 = 200;

fn consumer(
    broker: &str,
    topic: &str,
    db: &TestDb<Postgres>,
    hang: Option<&std::path::Path>,
) -> Process {
    let mut command = Command::new(env!("CARGO_BIN_EXE_event-test-consumer"));
    command
        .env("BROKER", broker)
        .env("TOPIC", topic)
        .env("GROUP", format!("{topic}-billing"))
        .env("DATABASE_URL", &db.url)
        .env("BATCH", "50")
        .env("NATS_URL", nats_url())
        .env("AMQP_URL", amqp_url())
        .env("KAFKA_URL", kafka_url())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    if let Some(marker) = hang {
        command.env("HANG_AFTER", "30").env("MARKER", marker);
    }
    Process(command.spawn().unwrap())
}

async fn publish_all(broker: &str, topic: &str, db: &TestDb<Postgres>) -> Option<()> {
    let outbox = orders_to(db.pool(), topic);
    commit_orders(
        &outbox,
        (0..EVENTS).map(|i| Order::place(&format!("o-{i}"), i).unwrap()),
    )
    .await;
    let config = RelayConfig::new("relay").batch_size(100);
    let published = match broker {
        "nats" => {
            let url = nats_url();
            let publisher = reachable("NATS", &url, NatsPublisher::connect(&url).await)?;
            stream_for(&publisher, topic).await.unwrap();
            drain(&outbox, publisher, config).await
        }
        "rabbitmq" => {
            let url = amqp_url();
            let publisher = reachable("RabbitMQ", &url, RabbitMqPublisher::connect(&url).await)?;
            publisher.declare_exchange(topic).await.unwrap();
            // The queue exists and is bound before anything is published to it.
            drop(
                RabbitMqSubscription::bind(
                    &publisher,
                    topic,
                    &format!("{topic}-billing"),
                    "order.*",
                )
                .await
                .unwrap(),
            );
            drain(&outbox, publisher, config).await
        }
        "kafka" => {
            let url = kafka_url();
            let publisher = reachable("Kafka", &url, KafkaPublisher::connect(&url).await)?;
            publisher.ensure_topic(topic, 3).await.unwrap();
            drain(&outbox, publisher, config).await
        }
        other => panic!("no broker {other}"),
    };
    assert_eq!(published, EVENTS as usize);
    Some(())
}

async fn drain(outbox: &Outbox<Postgres>, publisher: impl Publisher, config: RelayConfig) -> usize {
    outbox
        .relay(publisher, config)
        .drain()
        .await
        .unwrap()
        .published
}

async fn applied(db: &TestDb<Postgres>) -> (i64, i64) {
    sqlx::query_as("SELECT COUNT(*), COUNT(DISTINCT event_id) FROM applied")
        .fetch_one(db.pool())
        .await
        .unwrap()
}

async fn killed_mid_batch_applies_each_event_once(broker: &str) {
    let topic = unique("kill").replace('_', "-");
    let db = TestDb::postgres().await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE applied (pos BIGSERIAL PRIMARY KEY, aggregate_id TEXT NOT NULL, \
         sequence BIGINT NOT NULL, event_id TEXT NOT NULL)",
    )
    .execute(db.pool())
    .await
    .unwrap();
    if publish_all(broker, &topic, &db).await.is_none() {
        return;
    }

    let marker = std::env::temp_dir().join(format!("{topic}.mid-batch"));
    let mut victim = consumer(broker, &topic, &db, Some(&marker));
    wait::until(Duration::from_secs(60), async || {
        if marker.exists() {
            return Ok(());
        }
        match victim.0.try_wait() {
            Ok(Some(status)) => panic!("the consumer exited: {status}"),
            _ => Err("the consumer has not reached the middle of a batch".to_owned()),
        }
    })
    .await;
    victim.0.kill().unwrap();
    victim.0.wait().unwrap();
    let (rows, _) = applied(&db).await;
    assert!(rows < EVENTS, "killed before the end: {rows} applied");

    let _rescuer = consumer(broker, &topic, &db, None);
    wait::until(Duration::from_secs(90), async || match applied(&db).await {
        (rows, _) if rows >= EVENTS => Ok(()),
        (rows, _) => Err(format!("{rows} of {EVENTS} applied")),
    })
    .await;
    assert_eq!(
        applied(&db).await,
        (EVENTS, EVENTS),
        "each event applied once: rows, distinct events"
    );
    let _ = std::fs::remove_file(&marker);
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_consumer_killed_mid_batch_applies_each_event_once() {
    killed_mid_batch_applies_each_event_once("nats").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_consumer_killed_mid_batch_applies_each_event_once() {
    killed_mid_batch_applies_each_event_once("rabbitmq").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_consumer_killed_mid_batch_applies_each_event_once() {
    killed_mid_batch_applies_each_event_once("kafka").await;
}
