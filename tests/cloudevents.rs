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
    Consumer, Delivered, HandlerError, KafkaSubscription, Outbox, RabbitMqSubscription,
    RelayConfig, WireFormat,
};
use event_tests::any_broker::{
    AnyPublisher, AnySubscription, delete_queue, durable, kafka, nats, rabbitmq, stream_for,
};
use event_tests::db::{TestDb, amqp_url, kafka_url, nats_url, unique};
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
    // The required attributes and a subject: nothing of this toolkit's.
    let foreign = format!("foreign-{mode}");
    let legacy = format!("legacy-{mode}");
    let attributes = json!({"specversion": "1.0", "id": foreign, "type": "ORDER_PLACED",
        "source": "https://legacy.example/checkout", "subject": legacy});
    let data = json!({"order_id": legacy, "amount_minor": 9});
    lines.push(json!({"attributes": attributes, "data": data}));
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

/// Drains `subscription` until `want` events were applied and `want` copies came in as
/// duplicates; returns how many were applied.
async fn drain_all<R: event_sqlx::Routes<sqlx::Sqlite>>(
    subscription: &AnySubscription,
    consumer: &Consumer<sqlx::Sqlite, R>,
    want: usize,
) -> usize {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut applied = 0;
    let mut duplicates = 0;
    while applied < want || duplicates < want {
        assert!(
            tokio::time::Instant::now() < deadline,
            "applied {applied} and {duplicates} duplicates of {want} within a minute"
        );
        let report = subscription
            .drain(consumer, Duration::from_millis(500))
            .await
            .unwrap();
        assert_eq!(report.quarantined, 0, "{report:?}");
        applied += report.applied;
        duplicates += report.duplicates;
    }
    applied
}

/// One broker's side of a test: the publisher, and where the peer reads and publishes.
struct Target {
    broker: &'static str,
    url: String,
    topic: String,
    publisher: AnyPublisher,
    /// NATS: the topic's stream.
    stream: Option<String>,
}

#[derive(Debug, Clone, Copy)]
enum Broker {
    Nats,
    RabbitMq,
    Kafka,
}

impl Target {
    /// The broker's publisher and a fresh topic (stream, exchange) on it; `None` (the test
    /// skips) when the broker is unreachable, unless services are required.
    async fn open(broker: Broker) -> Option<Target> {
        let topic = unique("ce").replace('_', "-");
        Some(match broker {
            Broker::Nats => {
                let publisher = nats().await?;
                let stream = stream_for(&publisher, &topic).await.unwrap();
                Target {
                    broker: "nats",
                    url: nats_url(),
                    topic,
                    publisher: AnyPublisher::Nats(publisher),
                    stream: Some(stream),
                }
            }
            Broker::RabbitMq => {
                let publisher = rabbitmq().await?;
                publisher.declare_exchange(&topic).await.unwrap();
                Target {
                    broker: "rabbitmq",
                    url: amqp_url(),
                    topic,
                    publisher: AnyPublisher::Rabbit(publisher),
                    stream: None,
                }
            }
            Broker::Kafka => {
                let publisher = kafka().await?;
                publisher.ensure_topic(&topic, 1).await.unwrap();
                Target {
                    broker: "kafka",
                    url: kafka_url(),
                    topic,
                    publisher: AnyPublisher::Kafka(publisher),
                    stream: None,
                }
            }
        })
    }

    /// A subscription named `name` to every order event of the topic (on RabbitMQ, the queue
    /// `<topic>-<name>`, bound before anything is published).
    async fn subscription(&self, name: &str) -> AnySubscription {
        match &self.publisher {
            AnyPublisher::Nats(p) => AnySubscription::Nats(
                durable(
                    p,
                    self.stream.as_deref().unwrap(),
                    name,
                    &format!("{}.>", self.topic),
                )
                .await,
            ),
            AnyPublisher::Rabbit(p) => AnySubscription::Rabbit(
                RabbitMqSubscription::bind(p, &self.topic, &self.queue(name), "order.*")
                    .await
                    .unwrap(),
            ),
            AnyPublisher::Kafka(_) => AnySubscription::Kafka(
                KafkaSubscription::subscribe(&self.url, name, &[&self.topic])
                    .await
                    .unwrap(),
            ),
        }
    }

    fn queue(&self, name: &str) -> String {
        format!("{}-{name}", self.topic)
    }

    /// The peer's arguments for `action` in `format`: where it reads what the subscription
    /// `name` receives, or where it publishes placed orders.
    fn peer_args(&self, action: &str, format: WireFormat, name: &str) -> Vec<String> {
        let mut args: Vec<String> = [action, "--broker", self.broker, "--url", &self.url]
            .iter()
            .map(|a| (*a).to_owned())
            .collect();
        args.extend(["--mode".to_owned(), mode_name(format).to_owned()]);
        let place: Vec<String> = match (self.broker, action) {
            ("nats", "read") => vec![
                "--stream".into(),
                self.stream.clone().unwrap(),
                "--subject".into(),
                format!("{}.>", self.topic),
            ],
            ("nats", _) => vec!["--subject".into(), format!("{}.order.placed", self.topic)],
            ("rabbitmq", "read") => vec!["--queue".into(), self.queue(name)],
            ("rabbitmq", _) => vec![
                "--exchange".into(),
                self.topic.clone(),
                "--routing-key".into(),
                "order.placed".into(),
            ],
            _ => vec!["--topic".into(), self.topic.clone()],
        };
        args.extend(place);
        args
    }

    async fn close(self, name: &str) {
        match &self.publisher {
            AnyPublisher::Nats(p) => {
                let stream = self.stream.as_deref().unwrap();
                p.jetstream().delete_stream(stream).await.unwrap();
            }
            AnyPublisher::Rabbit(p) => delete_queue(p, &self.queue(name)).await,
            AnyPublisher::Kafka(_) => {}
        }
    }
}

/// The peer, a fresh topic on `broker` and a fresh SQLite database; `None` (the test skips) when
/// Python or the broker is missing, unless services are required.
async fn open(broker: Broker) -> Option<(PathBuf, Target, TestDb<sqlx::Sqlite>)> {
    let script = peer()?;
    let target = Target::open(broker).await?;
    Some((script, target, TestDb::sqlite().await.unwrap()))
}

/// On `broker`, in both modes: the relay publishes, Python reads every attribute, extension
/// and the data back.
async fn python_reads(broker: Broker) {
    for format in MODES {
        let Some((script, target, db)) = open(broker).await else {
            return;
        };
        // On RabbitMQ, the queue Python reads from (bound before the relay publishes); on
        // NATS, a durable; on Kafka, Python reads the topic's partitions without a group.
        let _queue = match broker {
            Broker::Kafka => None,
            _ => Some(target.subscription("python").await),
        };
        let outbox = committed(&db, &target.topic).await;
        let publisher = target.publisher.clone().wire_format(format);
        let relay = outbox.relay(publisher, RelayConfig::new("relay"));
        relay.drain().await.unwrap();
        let mut args = target.peer_args("read", format, "python");
        args.extend(["--count".to_owned(), (2 * ORDERS).to_string()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let read = run_peer(&script, &args, None).await;
        read_back(&outbox, &read, format).await;
        target.close("python").await;
        db.cleanup().await;
    }
}

/// On `broker`, in both modes: Python publishes each event twice, the subscription applies it
/// once.
async fn python_publishes(broker: Broker) {
    for format in MODES {
        let Some((script, target, db)) = open(broker).await else {
            return;
        };
        let consumer = recorder(&db).await;
        let subscription = target.subscription("python-orders").await;
        let (stdin, ids) = python_events(format);
        let args = target.peer_args("publish", format, "python-orders");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        // Twice: the second copy of each is a duplicate the inbox absorbs.
        run_peer(&script, &args, Some(stdin.clone())).await;
        run_peer(&script, &args, Some(stdin)).await;
        let applied = drain_all(&subscription, &consumer, ids.len()).await;
        assert_eq!(applied, ids.len());
        consumed_once(&db, format, &ids).await;
        target.close("python-orders").await;
        db.cleanup().await;
    }
}

/// A test per broker and direction, each running its scenario on two worker threads.
macro_rules! scenarios {
    ($($test:ident => $scenario:ident($broker:ident)),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            $scenario(Broker::$broker).await;
        }
    )*};
}

scenarios! {
    python_reads_what_the_relay_published_on_jetstream => python_reads(Nats),
    python_reads_what_the_relay_published_on_rabbitmq => python_reads(RabbitMq),
    python_reads_what_the_relay_published_on_kafka => python_reads(Kafka),
    jetstream_consumes_what_python_published_once_each => python_publishes(Nats),
    rabbitmq_consumes_what_python_published_once_each => python_publishes(RabbitMq),
    kafka_consumes_what_python_published_once_each => python_publishes(Kafka),
}
