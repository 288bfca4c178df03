//! CloudEvents on the real brokers, proven against another language's own client: a Python
//! program (`tests/python/ce_peer.py`) using the CloudEvents Python SDK's bindings with
//! confluent-kafka, pika and nats-py reads what the relay published in both CloudEvents modes
//! and gets every attribute, extension and the data back; and it publishes CloudEvents, ours
//! and a foreign one without this toolkit's extensions, that the subscriptions consume into
//! the inbox once each.

use std::path::PathBuf;
use std::time::Duration;

use event_core::{EventContext, UnitOfWork};
use event_sqlx::{
    Consumer, Delivered, HandlerError, JetStreamSubscription, KafkaPublisher, KafkaSubscription,
    Outbox, RabbitMqSubscription, RelayConfig, WireFormat,
};
use event_tests::any_broker::{durable, nats, rabbitmq, stream_for};
use event_tests::db::{TestDb, amqp_url, kafka_url, nats_url, reachable, unique};
use event_tests::fixtures::{Order, OrderPlaced, placed_and_paid_to};
use serde_json::{Value, json};

const ORDERS: usize = 3;
const MODES: [WireFormat; 2] = [
    WireFormat::CloudEventsBinary,
    WireFormat::CloudEventsStructured,
];

/// The peer script, when Python has what it imports; `None` (the test skips) otherwise, unless
/// services are required.
fn peer() -> Option<PathBuf> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/ce_peer.py");
    let ok = std::process::Command::new(python())
        .args(["-c", "import cloudevents.core, confluent_kafka, pika, nats"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some(script);
    }
    assert!(
        std::env::var("EVENT_TEST_REQUIRE_SERVICES").as_deref() != Ok("1"),
        "the CloudEvents peer needs Python with tests/python/requirements.txt installed: \
         python3 -m pip install -r tests/python/requirements.txt"
    );
    eprintln!("skipped: Python lacks tests/python/requirements.txt");
    None
}

fn python() -> String {
    std::env::var("EVENT_TEST_PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

/// Runs the peer with `args` (and `stdin`), within a minute; what it printed, one JSON value a
/// line.
async fn run_peer(script: &PathBuf, args: &[&str], stdin: Option<String>) -> Vec<Value> {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(python())
        .arg(script)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the Python peer");
    let mut input = child.stdin.take().unwrap();
    input
        .write_all(stdin.unwrap_or_default().as_bytes())
        .await
        .unwrap();
    drop(input);
    let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the Python peer finished within a minute")
        .unwrap();
    assert!(
        output.status.success(),
        "ce_peer.py {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

fn mode_name(format: WireFormat) -> &'static str {
    format.name()
}

/// A context that sets every header the mapping carries.
fn context() -> EventContext {
    EventContext::new("order-service")
        .tenant_id("acme")
        .correlation_id("checkout-7")
        .causation_id("cmd-42")
        .traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        .unwrap()
        .header("region", "eu")
        .header("User-Agent", "shop/1.0")
}

/// `ORDERS` orders placed and paid, routed to `topic`, committed with [`context`].
async fn committed(db: &TestDb<sqlx::Sqlite>, topic: &str) -> Outbox<sqlx::Sqlite> {
    let outbox = placed_and_paid_to(db.pool(), topic);
    let mut uow = UnitOfWork::new(context());
    for i in 0..ORDERS {
        let mut order = Order::paid(&format!("o-{i}"), 100 + i as i64);
        uow.collect(&mut order).unwrap();
    }
    let _ = outbox
        .commit(db.pool().begin().await.unwrap(), uow)
        .await
        .unwrap();
    outbox
}

/// What Python read is every event of the outbox, each attribute, extension and the data as
/// the mapping says, in `format`.
async fn read_back(outbox: &Outbox<sqlx::Sqlite>, read: &[Value], format: WireFormat) {
    assert_eq!(read.len(), 2 * ORDERS, "{read:#?}");
    for event in read {
        assert_eq!(event["mode"], mode_name(format), "{event:#}");
        let a = &event["attributes"];
        let id = a["id"].as_str().unwrap();
        let row = outbox
            .by_event_no(id)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("Python read {id}, which is not in the outbox"));
        let e = row.envelope().unwrap();
        let expected = json!({
            "specversion": "1.0",
            "id": e.event_id.as_str(),
            "source": "order-service",
            "type": e.event_type,
            "subject": e.aggregate_id,
            "dataschema": format!("urn:event-type:{}:v{}", e.event_type, e.event_version),
            "datacontenttype": "application/json",
            "aggregatetype": "ORDER",
            "partitionkey": e.aggregate_id,
            "sequence": format!("{:020}", e.aggregate_sequence),
            "tenantid": "acme",
            "correlationid": "checkout-7",
            "causationid": "cmd-42",
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "region": "eu",
            "extraheaders": r#"{"User-Agent":"shop/1.0"}"#,
            "time": a["time"],
        });
        assert_eq!(a, &expected, "{id}");
        let time = chrono::DateTime::parse_from_rfc3339(a["time"].as_str().unwrap()).unwrap();
        assert_eq!(time, e.occurred_at, "{id}: time");
        assert_eq!(event["data"], e.payload, "{id}: data");
        if !event["key"].is_null() {
            assert_eq!(event["key"], e.aggregate_id.as_str(), "{id}: Kafka key");
        }
    }
}

/// The events Python publishes in `format`: `ORDERS` placed orders with this toolkit's
/// extensions, and one from a producer that sets none of them.
fn python_events(format: WireFormat) -> (String, Vec<String>) {
    let mode = mode_name(format);
    let mut lines = Vec::new();
    let mut ids = Vec::new();
    for i in 0..ORDERS {
        let id = format!("py-{mode}-{i}");
        let order = format!("py-{mode}-o-{i}");
        lines.push(json!({
            "attributes": {
                "specversion": "1.0",
                "id": id,
                "source": "python-checkout",
                "type": "ORDER_PLACED",
                "subject": order,
                "time": "2026-12-02T10:11:12.345678Z",
                "datacontenttype": "application/json",
                "dataschema": "urn:event-type:ORDER_PLACED:v1",
                "aggregatetype": "ORDER",
                "partitionkey": order,
                "sequence": "00000000000000000001",
                "tenantid": "acme",
            },
            "data": {"order_id": order, "amount_minor": 500 + i},
        }));
        ids.push(id);
    }
    let foreign = format!("foreign-{mode}");
    lines.push(json!({
        "attributes": {
            "specversion": "1.0",
            "id": foreign,
            "source": "https://legacy.example/checkout",
            "type": "ORDER_PLACED",
            "subject": format!("legacy-{mode}"),
        },
        "data": {"order_id": format!("legacy-{mode}"), "amount_minor": 9},
    }));
    ids.push(foreign);
    let stdin = lines.iter().map(|l| format!("{l}\n")).collect();
    (stdin, ids)
}

/// A consumer that records each placed order with where it came from.
async fn recorder(
    db: &TestDb<sqlx::Sqlite>,
) -> Consumer<sqlx::Sqlite, impl event_sqlx::Routes<sqlx::Sqlite> + use<>> {
    sqlx::query(
        "CREATE TABLE placed (order_id TEXT PRIMARY KEY, source TEXT, tenant TEXT, \
         aggregate_type TEXT, sequence INTEGER, amount INTEGER)",
    )
    .execute(db.pool())
    .await
    .unwrap();
    Consumer::new(db.pool().clone(), "python-orders", "1").on(
        async |tx: &mut sqlx::SqliteConnection,
               e: Delivered<OrderPlaced>|
               -> Result<(), HandlerError> {
            sqlx::query("INSERT INTO placed VALUES (?, ?, ?, ?, ?, ?)")
                .bind(&e.order_id)
                .bind(&e.envelope.headers.source)
                .bind(&e.envelope.headers.tenant_id)
                .bind(&e.envelope.aggregate_type)
                .bind(e.envelope.aggregate_sequence as i64)
                .bind(e.amount_minor)
                .execute(&mut *tx)
                .await?;
            Ok(())
        },
    )
}

/// Every event Python published was applied once, decoded as `OrderPlaced`, and the foreign
/// one by the documented rule.
async fn consumed_once(db: &TestDb<sqlx::Sqlite>, format: WireFormat, ids: &[String]) {
    let mode = mode_name(format);
    let rows: Vec<(String, String, Option<String>, String, i64, i64)> = sqlx::query_as(
        "SELECT order_id, source, tenant, aggregate_type, sequence, amount FROM placed \
         WHERE order_id LIKE ? OR order_id = ? ORDER BY order_id",
    )
    .bind(format!("py-{mode}-%"))
    .bind(format!("legacy-{mode}"))
    .fetch_all(db.pool())
    .await
    .unwrap();
    let mut expected: Vec<(String, String, Option<String>, String, i64, i64)> = (0..ORDERS)
        .map(|i| {
            (
                format!("py-{mode}-o-{i}"),
                "python-checkout".to_owned(),
                Some("acme".to_owned()),
                "ORDER".to_owned(),
                1,
                500 + i as i64,
            )
        })
        .collect();
    expected.push((
        format!("legacy-{mode}"),
        "https://legacy.example/checkout".to_owned(),
        None,
        "https://legacy.example/checkout".to_owned(),
        0,
        9,
    ));
    expected.sort();
    assert_eq!(rows, expected);
    for id in ids {
        let consumed: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM consumed_event WHERE consumer = 'python-orders' AND event_id = ?",
        )
        .bind(id)
        .fetch_one(db.pool())
        .await
        .unwrap();
        assert_eq!(consumed, 1, "{id} in the inbox once");
    }
}

/// Drains `drain` until `want` events were applied, and then once more to see the copies come
/// in as duplicates.
async fn drain_all<F: AsyncFn() -> event_sqlx::ConsumeReport>(drain: F, want: usize) -> usize {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut applied = 0;
    let mut duplicates = 0;
    while applied < want || duplicates < want {
        assert!(
            tokio::time::Instant::now() < deadline,
            "applied {applied} and {duplicates} duplicates of {want} within a minute"
        );
        let report = drain().await;
        assert_eq!(report.quarantined, 0, "{report:?}");
        applied += report.applied;
        duplicates += report.duplicates;
    }
    applied
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_reads_what_the_relay_published_on_jetstream() {
    let (Some(script), Some(publisher)) = (peer(), nats().await) else {
        return;
    };
    for format in MODES {
        let db = TestDb::sqlite().await.unwrap();
        let topic = unique("ce").replace('_', "-");
        let stream = stream_for(&publisher, &topic).await.unwrap();
        let outbox = committed(&db, &topic).await;
        let relay = outbox.relay(
            publisher.clone().wire_format(format),
            RelayConfig::new("relay"),
        );
        relay.drain().await.unwrap();
        let count = (2 * ORDERS).to_string();
        let read = run_peer(
            &script,
            &[
                "read",
                "--broker",
                "nats",
                "--url",
                &nats_url(),
                "--mode",
                mode_name(format),
                "--stream",
                &stream,
                "--subject",
                &format!("{topic}.>"),
                "--count",
                &count,
            ],
            None,
        )
        .await;
        read_back(&outbox, &read, format).await;
        publisher.jetstream().delete_stream(&stream).await.unwrap();
        db.cleanup().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_consumes_what_python_published_once_each() {
    let (Some(script), Some(publisher)) = (peer(), nats().await) else {
        return;
    };
    for format in MODES {
        let db = TestDb::sqlite().await.unwrap();
        let consumer = recorder(&db).await;
        let topic = unique("ce").replace('_', "-");
        let stream = stream_for(&publisher, &topic).await.unwrap();
        let subscription: JetStreamSubscription =
            durable(&publisher, &stream, "python-orders", &format!("{topic}.>")).await;
        let (stdin, ids) = python_events(format);
        let subject = format!("{topic}.order.placed");
        let args = [
            "publish",
            "--broker",
            "nats",
            "--url",
            &nats_url(),
            "--mode",
            mode_name(format),
            "--subject",
            &subject,
        ];
        // Twice: the second copy of each is a duplicate the inbox absorbs.
        run_peer(&script, &args, Some(stdin.clone())).await;
        run_peer(&script, &args, Some(stdin)).await;
        let applied = drain_all(
            async || {
                subscription
                    .drain(&consumer, Duration::from_millis(300))
                    .await
                    .unwrap()
            },
            ids.len(),
        )
        .await;
        assert_eq!(applied, ids.len());
        consumed_once(&db, format, &ids).await;
        publisher.jetstream().delete_stream(&stream).await.unwrap();
        db.cleanup().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_reads_what_the_relay_published_on_rabbitmq() {
    let (Some(script), Some(publisher)) = (peer(), rabbitmq().await) else {
        return;
    };
    for format in MODES {
        let db = TestDb::sqlite().await.unwrap();
        let exchange = unique("ce").replace('_', "-");
        publisher.declare_exchange(&exchange).await.unwrap();
        let queue = format!("{exchange}-python");
        let _bound = RabbitMqSubscription::bind(&publisher, &exchange, &queue, "order.*")
            .await
            .unwrap();
        let outbox = committed(&db, &exchange).await;
        let relay = outbox.relay(
            publisher.clone().wire_format(format),
            RelayConfig::new("relay"),
        );
        relay.drain().await.unwrap();
        let count = (2 * ORDERS).to_string();
        let read = run_peer(
            &script,
            &[
                "read",
                "--broker",
                "rabbitmq",
                "--url",
                &amqp_url(),
                "--mode",
                mode_name(format),
                "--queue",
                &queue,
                "--count",
                &count,
            ],
            None,
        )
        .await;
        read_back(&outbox, &read, format).await;
        delete_queue(&publisher, &queue).await;
        db.cleanup().await;
    }
}

async fn delete_queue(publisher: &event_sqlx::RabbitMqPublisher, queue: &str) {
    publisher
        .channel()
        .queue_delete(
            lapin::types::ShortString::from(queue),
            lapin::options::QueueDeleteOptions::default(),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_consumes_what_python_published_once_each() {
    let (Some(script), Some(publisher)) = (peer(), rabbitmq().await) else {
        return;
    };
    for format in MODES {
        let db = TestDb::sqlite().await.unwrap();
        let consumer = recorder(&db).await;
        let exchange = unique("ce").replace('_', "-");
        publisher.declare_exchange(&exchange).await.unwrap();
        let queue = format!("{exchange}-orders");
        let subscription = RabbitMqSubscription::bind(&publisher, &exchange, &queue, "order.*")
            .await
            .unwrap();
        let (stdin, ids) = python_events(format);
        let args = [
            "publish",
            "--broker",
            "rabbitmq",
            "--url",
            &amqp_url(),
            "--mode",
            mode_name(format),
            "--exchange",
            &exchange,
            "--routing-key",
            "order.placed",
        ];
        run_peer(&script, &args, Some(stdin.clone())).await;
        run_peer(&script, &args, Some(stdin)).await;
        let applied = drain_all(
            async || {
                subscription
                    .drain(&consumer, Duration::from_millis(300))
                    .await
                    .unwrap()
            },
            ids.len(),
        )
        .await;
        assert_eq!(applied, ids.len());
        consumed_once(&db, format, &ids).await;
        delete_queue(&publisher, &queue).await;
        db.cleanup().await;
    }
}

/// A publisher on the Kafka-protocol broker of `EVENT_TEST_KAFKA_URL`; `None` (the test skips)
/// when it is unreachable, unless services are required.
async fn kafka() -> Option<KafkaPublisher> {
    let url = kafka_url();
    reachable("Kafka", &url, KafkaPublisher::connect(&url).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_reads_what_the_relay_published_on_kafka() {
    let (Some(script), Some(publisher)) = (peer(), kafka().await) else {
        return;
    };
    for format in MODES {
        let db = TestDb::sqlite().await.unwrap();
        let topic = unique("ce").replace('_', "-");
        publisher.ensure_topic(&topic, 1).await.unwrap();
        let outbox = committed(&db, &topic).await;
        let relay = outbox.relay(
            publisher.clone().wire_format(format),
            RelayConfig::new("relay"),
        );
        relay.drain().await.unwrap();
        let count = (2 * ORDERS).to_string();
        let read = run_peer(
            &script,
            &[
                "read",
                "--broker",
                "kafka",
                "--url",
                &kafka_url(),
                "--mode",
                mode_name(format),
                "--topic",
                &topic,
                "--count",
                &count,
            ],
            None,
        )
        .await;
        read_back(&outbox, &read, format).await;
        db.cleanup().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_consumes_what_python_published_once_each() {
    let (Some(script), Some(publisher)) = (peer(), kafka().await) else {
        return;
    };
    for format in MODES {
        let db = TestDb::sqlite().await.unwrap();
        let consumer = recorder(&db).await;
        let topic = unique("ce").replace('_', "-");
        publisher.ensure_topic(&topic, 1).await.unwrap();
        let subscription = KafkaSubscription::subscribe(&kafka_url(), "python-orders", &[&topic])
            .await
            .unwrap();
        let (stdin, ids) = python_events(format);
        let args = [
            "publish",
            "--broker",
            "kafka",
            "--url",
            &kafka_url(),
            "--mode",
            mode_name(format),
            "--topic",
            &topic,
        ];
        run_peer(&script, &args, Some(stdin.clone())).await;
        run_peer(&script, &args, Some(stdin)).await;
        let applied = drain_all(
            async || {
                subscription
                    .drain(&consumer, Duration::from_millis(500))
                    .await
                    .unwrap()
            },
            ids.len(),
        )
        .await;
        assert_eq!(applied, ids.len());
        consumed_once(&db, format, &ids).await;
        db.cleanup().await;
    }
}
